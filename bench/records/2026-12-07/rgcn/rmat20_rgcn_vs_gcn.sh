export OMP_NUM_THREADS=1   # g3mpi installed, its venv on PATH
cd "${WORK:-.}"  # the directory holding r20t-p1 (prepared as in the record)
for m in rgcn gcn; do
  /usr/bin/time -v python -m mpi4py -m g3mpi.cli.train --parts r20t-p1 --out bruns/$m-p1b --force --model $m --layers 2 --hidden 16 \
     --epochs 6 --no-progress --no-plots 2> bruns-$m.err | tail -1
  grep -E "Maximum resident|Elapsed" bruns-$m.err
done
