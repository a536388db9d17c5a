# ten.sh GRAPH: 10 runs of the default g3-partition --parts 8, then node-balanced METIS once
set -e
g=$1; uptime
for i in 1 2 3 4 5 6 7 8 9 10; do
  s=$(date +%s.%N); g3-partition $g --parts 8 --out /tmp/ten-$g --force --no-progress 2>/dev/null
  printf "run %2d %6.1fs " $i $(echo "$(date +%s.%N) - $s" | bc); python "$(dirname "$0")"/cks.py /tmp/ten-$g
done
g3-partition $g --parts 8 --method metis --out /tmp/ten-$g-metis --force --no-progress 2>/dev/null
printf "metis  "; python "$(dirname "$0")"/cks.py /tmp/ten-$g-metis; uptime
