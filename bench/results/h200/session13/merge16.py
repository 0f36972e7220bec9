"""Table B: the base table with the M <= 16 buckets of a --max-m 16 tune (per shape)."""
import json, sys
base = json.load(open(sys.argv[1])); new = json.load(open(sys.argv[2]))
idx = {(s['n'], s['k']): s for s in new['shapes']}
changed = 0
for s in base['shapes']:
    t = idx.get((s['n'], s['k']))
    if t is None:
        continue
    lo = [b for b in t['buckets'] if b['m_hi'] <= 16]
    assert lo and lo[-1]['m_hi'] == 16 and lo[0]['m_lo'] == 1, (s['n'], s['k'], lo)
    assert any(b['m_hi'] == 16 for b in s['buckets']), (s['n'], s['k'])
    old = [b for b in s['buckets'] if b['m_hi'] <= 16]
    for b in lo:
        print(s['n'], s['k'], f"[{b['m_lo']},{b['m_hi']}]", b['fp8_config'] or '(heuristic)', round(b['fp8_us'], 2))
    print('   was', [(b['m_lo'], b['m_hi'], b['fp8_config']) for b in old])
    s['buckets'] = lo + [b for b in s['buckets'] if b['m_hi'] > 16]
    changed += 1
base['stamp']['fp8proj_version'] += ' (M <= 16 buckets re-tuned: ' + new['stamp']['fp8proj_version'] + ')'
json.dump(base, open(sys.argv[3], 'w'), indent=1, sort_keys=True)
print('merged the M <= 16 buckets of', changed, 'shapes')
