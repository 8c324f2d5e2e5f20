"""Training checkpoints: RUN/checkpoints/step_<N>/ directories, written atomically, checked by their manifest.

- ``layout``: the names (step dirs, the COMPLETE marker, the files a checkpoint holds), torch-free;
- ``manifest``: each checkpoint's list of files with sizes and hashes, and the choice of the newest usable one,
  torch-free, so the controller checks a run's checkpoints before it launches anything;
- ``tensors``: state dicts made fit for safetensors (shared storage written once), also what weight sync sends;
- ``rng``: every RNG state the trainer draws from;
- ``store``: save (temp dir, then rename), prune and load, falling back past a damaged checkpoint.

This package imports nothing else of slimecli: the controller and the trainer both stand on it.
"""
