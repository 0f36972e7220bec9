#!/bin/bash
# Session 16, call 4: the weight's L2 policy for large weights. Call 3's Nsight Compute at
# 6144x16384, M = 4096: our kernel reads ~30% more DRAM bytes than DeepGEMM's and runs at a lower
# clock (1.46 vs 1.52 GHz). A = session 15's main (evict-first unless N x K <= 48 MiB and 5+ M
# blocks), B = libE (evict-first only at <= 4 M blocks, whatever the weight's size); identical
# SASS, same table. Both ways round, M = 512..32768 on the six shapes (the K = 16384 shapes at 5+
# M blocks change; the rest are controls). Then Nsight Compute of B's kernel at that point.
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
tar xJf build-pack/s16/bundle_s16.txz && export LD_LIBRARY_PATH=$PWD/.device/lib
xz -dc build-pack/s16/libMain.so.xz > .device/libMain.so; chmod +x .device/libMain.so
xz -dc build-pack/s16/libE.so.xz > .device/libE.so; chmod +x .device/libE.so
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit --format=csv > $OUT/gpu.txt
mkdir -p $OUT/ab
OUT=$OUT/ab FP8PROJ_C_LIB=$PWD/.device/libMain.so FP8PROJ_TUNE_FILE=$PWD/configs/nvidia-h200.json \
  FP8PROJ_C_LIB_B=$PWD/.device/libE.so AB_BOTH_WAYS=1 RUNS=2 \
  COMPARE_ARGS="--reps 45 --m 512,1024,2048,4096,8192,16384,32768" timeout 430 bash scripts/h200_deepgemm.sh > $OUT/dg.log 2>&1
echo "rc $?"; cat $OUT/ab/ab_both_ways.md
export PYTHONPATH=$PWD/build-deepgemm/DeepGEMM DG_JIT_CACHE_DIR=$PWD/build-deepgemm/jit-cache
for L in libMain libE; do
  FP8PROJ_TUNE_FILE=$PWD/configs/nvidia-h200.json timeout 100 ncu --clock-control none -k "regex:sm90_fp8_gemm_1d2d_kernel" \
    --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --metrics sm__cycles_active.avg,sm__cycles_elapsed.max,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum \
    python3 scripts/compare_deepgemm.py --lib $PWD/.device/$L.so --only 6144,16384 --m 4096 --reps 2 --warmup 1 \
    --out /tmp/ncu_tmp_$L > $OUT/ab/ncu_${L}_6144x16384x4096.log 2>&1; echo "ncu $L rc $?"
  grep -E "SM Frequency|Duration|DRAM Throughput|L2 Cache Throughput|dram__bytes|lts__t_bytes|Elapsed Cycles" $OUT/ab/ncu_${L}_6144x16384x4096.log
done
cd $OUT && tar czf ab.tgz ab && rm -rf ab
