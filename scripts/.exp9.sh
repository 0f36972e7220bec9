set -u
tar xJf build-pack/bundle.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
build-pack/exp/h_rank0 --quick > $OUT/quick_rank0.log 2>&1; echo "quick rc=$? $(tail -1 $OUT/quick_rank0.log)"
args=()
for nk in 16384,2048 4096,2048 6144,16384 6144,4096 24576,1536 7168,16384; do
  for m in 1024 4096 8192; do args+=(--mnk $m,$nk); done
done
bash scripts/ab.sh 2 build-pack/exp/h_mcn2 build-pack/exp/h_rank0 -- --reps 15 "${args[@]}"
python3 scripts/ab_compare.py $OUT/ab --base h_mcn2 | tail -3
gzip $OUT/quick_rank0.log
