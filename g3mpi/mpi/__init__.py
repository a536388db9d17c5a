"""The torch-free MPI base that g3mpi and data_tools share (mpi4py, numpy): deadlines and quiet waits
(:mod:`.watchdog`), ending a job with one line (:mod:`.abort`), buffer collectives and the agreement on errors
(:mod:`.collectives`), ghost plans (:mod:`.ghost`), stop signals (:mod:`.stop`, :mod:`.termination`), peak RSS
(:mod:`.rss`). Nothing here imports torch or the rest of g3mpi."""
