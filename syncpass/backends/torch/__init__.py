"""The torch backend: pipe_split() sync points, torch.distributed.pipelining runs, profiling and static estimates."""
