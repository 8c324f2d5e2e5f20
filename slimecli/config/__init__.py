"""Config: the schema, Hydra composition, validation, and the frozen run config."""
