"""Runtime: what an audit needs from its process and machine: ``torch.distributed`` shards
and collectives, the progress display, output folders replaced whole, and measurement of
time and peak memory."""
