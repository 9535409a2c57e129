# Top SASS instructions by warp stall samples, and the samples by reason, from the CSV of
# `ncu --page source --csv --print-source sass` (`scripts/device.sh profile`): ncu_stalls.py CSV [ROWS].
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
hi = next(i for i, r in enumerate(rows) if any('Source' == c for c in r))
h = rows[hi]; data = [r for r in rows[hi + 1:] if len(r) == len(h)]
src = h.index('Source')
def num(x):
    try: return float(x.replace(',', ''))
    except: return 0.0
cols = [i for i, c in enumerate(h) if 'stall' in c.lower() or 'Sampl' in c]
tot = [i for i in cols if 'All Samples' in h[i] and 'Not' not in h[i]]
t = tot[0] if tot else cols[0]
total = sum(num(r[t]) for r in data)
print('columns:', [h[i] for i in cols][:40])
print('total samples', total)
reasons = [i for i in cols if i != t and 'Sampl' not in h[i]]
agg = {h[i]: sum(num(r[i]) for r in data) for i in reasons}
print('by reason:', sorted(((round(v / max(total,1) * 100, 1), k) for k, v in agg.items() if v), reverse=True)[:12])
order = {id(r): n for n, r in enumerate(data)}
for r in sorted(data, key=lambda r: -num(r[t]))[:int(sys.argv[2]) if len(sys.argv) > 2 else 30]:
    top = sorted(((num(r[i]), h[i]) for i in reasons if num(r[i])), reverse=True)[:3]
    print(f'{num(r[t]) / max(total,1) * 100:5.1f}%  {r[src][:70]:70s}', ' '.join(f'{k.replace("stall_","")[:18]}={v:.0f}' for v, k in top))
    # A hot branch is usually a wait loop: the instructions before it say which one.
    if 'BRA' in r[src] and num(r[t]) / max(total, 1) > 0.03:
        n = order[id(r)]
        for c in data[max(0, n - 5):n]: print('          |', c[src][:90])
