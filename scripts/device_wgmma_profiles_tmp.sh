for T in 512 1088; do
  mkdir -p $OUT/p$T
  KERNEL=nvfp4_wgmma ARGS="--ops moe --moe-tokens $T --moe-backend wgmma" OUT=$OUT/p$T bash scripts/device_gemm_profile.sh > $OUT/p$T/summary.txt 2>&1
  rm -f $OUT/p$T/all.sass.gz $OUT/p$T/profile.ncu-rep
done
for T in 512 1088; do
  echo "=== T=$T gate_up"
  grep -E "^ *(Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Registers Per Thread|Block Size|Grid Size|Dynamic Shared)" $OUT/p$T/ncu.txt | sed 's/  */ /g' | head -20
  grep -E "tensor" $OUT/p$T/ncu.txt | sed 's/  */ /g' | head -4
  sed -n '/^by reason/,$p' $OUT/p$T/summary.txt | cut -c1-150 | head -45
done
