"""g3mpi data tools: importers, generators, partitioners and inspection (never imports the trainer)."""
