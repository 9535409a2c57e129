# `scripts/device.sh synth`: the full-size synthetic checkpoint (SYNTH_PRESET, Qwen3-30B-A3B by
# default) written anew, timed beside the disk's own sequential write speed (dd, 8 GB, synced),
# then `nibble inspect` of it.
rm -rf "$SYNTH_DIR"
df -h "$(dirname "$SYNTH_DIR")" | tail -1
dd if=/dev/zero of="$SYNTH_DIR.dd" bs=16M count=512 conv=fdatasync 2>&1 | tail -1 > "$OUT/dd.txt"
rm -f "$SYNTH_DIR.dd"
build-device/nibble synth --preset "$SYNTH_PRESET" --out "$SYNTH_DIR" --seed 0 > "$OUT/synth.log" 2>&1
echo "synth $SYNTH_PRESET rc=$?: $(grep '^wrote' "$OUT/synth.log")"
echo "disk (dd, 8 GB): $(cat "$OUT/dd.txt")"
build-device/nibble inspect "$SYNTH_DIR" > "$OUT/inspect.log" 2>&1
echo "inspect rc=$?: $(grep -E '^(problems|per token)' "$OUT/inspect.log" | tr '\n' ' ')"
