export LD_LIBRARY_PATH=$PWD/build-device/lib
timeout 200 build-device/tests/test_cuda_moe > $OUT/moe.log 2>&1; echo rc=$?; grep -E "FAIL|Failure|Expected|actual|OK \]" $OUT/moe.log | head -20
OPS=moe timeout 250 bash scripts/device_kernels.sh 2>&1 | grep -E "^moe.*fused"
for T in 1 128 8192; do
timeout 100 ncu --clock-control none --csv --metrics gpu__time_duration.sum,smsp__inst_executed.sum --launch-count 6 build-device/nibble bench kernels --ops moe --moe-tokens $T --iterations 1 --batches 1 > $OUT/ncu_$T.csv 2>&1
echo "== T=$T"; grep -E "gpu__time|inst_exec" $OUT/ncu_$T.csv | python3 -c "
import sys,csv
for r in csv.reader(sys.stdin): print(r[4][:30].ljust(30), r[8], r[-3][:22], r[-1])"
done
