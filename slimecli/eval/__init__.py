"""Held-out evaluation: datasets (eval.datasets), pass@k, and the evaluator that samples them on the engines.

During training rank 0 evaluates with the weights just pushed to the engines (train/loop.py, the `eval`
stage); `slimecli eval` runs the same evaluator as a worker next to engines serving a checkpoint
(`python -m slimecli.eval`). Either way the results are the metrics eval/<name>/... and per-sample files
RUN/eval/step_<N>/<name>.jsonl.
"""
