# Finds kernels whose global loads wait behind their own stores: a plain (not .nc) ld.global within a few
# PTX instructions after an st.global, which the compiler keeps in order because the two pointers may
# alias (docs/lab/perf-notebook.md, "Memory latencies the compiler could not overlap"); and kernels that store to
# local memory outside sincosf's slow path (an array indexed or chosen at run time, kept in memory).
# Compiles our own CUDA files (not FlashInfer's wrappers) to PTX for sm_90a:
# python3 scripts/ptx_alias_scan.py [MIN_HITS] [FILE.cu ...].
import pathlib, re, subprocess, sys, tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
WINDOW = 4  # instructions after a store in which a load counts as ordered behind it


def scan(ptx):
    """{kernel: [loads found right after a store, local stores]} for one PTX text. sincosf's slow path
    (Payne-Hanek, |x| > ~1e5) stores its reduction words to local memory after reading them from
    __cudart_i2opi_f: stores within 40 lines of that table's name are not counted."""
    hits, kernel = {}, "?"
    lines = ptx.splitlines()
    for i, line in enumerate(lines):
        entry = re.search(r"\.entry\s+(\S+?)\(", line)
        if entry:
            kernel = entry.group(1)
        counts = hits.setdefault(kernel, [0, 0])
        if "st.local" in line and not any("__cudart_i2opi_f" in before for before in lines[max(0, i - 40) : i]):
            counts[1] += 1
        if "st.global" not in line:
            continue
        for later in lines[i + 1 : i + 1 + WINDOW]:
            if "ld.global" in later and ".nc" not in later:
                counts[0] += 1
                break
    return hits


def main():
    args = sys.argv[1:]
    min_hits = int(args.pop(0)) if args and args[0].isdigit() else 3
    files = [pathlib.Path(a) for a in args] or sorted(
        f for f in (ROOT / "src/cuda").rglob("*.cu") if not f.name.startswith("flashinfer"))
    with tempfile.TemporaryDirectory() as tmp:
        for source in files:
            ptx_path = pathlib.Path(tmp) / (source.stem + ".ptx")
            cmd = ["nvcc", "-std=c++20", "-O3", "-gencode=arch=compute_90a,code=sm_90a", f"-I{ROOT / 'src'}", "-ptx",
                   "-o", str(ptx_path), str(source)]
            built = subprocess.run(cmd, capture_output=True, text=True)
            if built.returncode != 0:
                print(f"{source.name}: nvcc failed: {built.stderr.strip().splitlines()[-1:]}")
                continue
            for kernel, (loads, local) in sorted(scan(ptx_path.read_text()).items(), key=lambda kv: -kv[1][0]):
                if loads >= min_hits or local >= min_hits:
                    print(f"{source.name}: {loads:4d} loads after stores, {local:3d} local stores in {kernel[:130]}")


if __name__ == "__main__":
    main()
