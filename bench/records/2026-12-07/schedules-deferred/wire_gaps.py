"""The wire's idle gaps in a g3-bench schedules JSON (worker output, e.g. WORK/schedules-gcn-2-1Gbit-50us.json):
per rank, each transfer's first send and last landing, and the phase marks of the recorded epoch.

    python wire_gaps.py FILE.json ...
"""
import json, sys
for f in sys.argv[1:]:
    d = json.load(open(f))
    for v, var in d['variants'].items():
        t = var.get('timeline')
        if not t or var['schedule'] == 'nocomm': continue
        med = sorted(e['epoch_time_s'] for e in var['epochs'])[len(var['epochs'])//2]
        print(f"== {f.split('/')[-2]} {var['schedule']} median epoch {med:.3f} timeline-sched {t['schedule']}")
        for r in t['ranks']:
            first, last, phases = {}, {}, []
            for e in r['events']:
                k, name, t0, t1 = e[0], e[1], e[2], e[3]
                if k == 'send': first.setdefault(name, t0)
                if k == 'land': last[name] = t0
                if k == 'phase': phases.append(f"{name}@{t0:.3f}")
            s = "  ".join(f"{n}:{first.get(n,0):.3f}-{last.get(n,0):.3f}" for n in first)
            print("  ", s, " ", " ".join(phases))
