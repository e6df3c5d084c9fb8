"""Benchmarks: the SLIDE engine against a dense full-softmax PyTorch baseline."""
