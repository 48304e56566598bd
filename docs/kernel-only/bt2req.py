import re, sys, collections
txt = open(sys.argv[1], errors='replace').read()
evs = []
for part in txt.split('@@EV ')[1:]:
    head, _, data = part.partition('\n')
    tid, fd, kind, n, t = head.split()
    evs.append((int(tid), int(fd), kind, int(n), int(t), data))
rid = re.compile(r'x-request-id: (\d+)', re.I)
last = {}; steps = collections.defaultdict(lambda: collections.defaultdict(list))
for tid, fd, kind, n, t, d in evs:
    ms = rid.findall(d)
    m = max(ms, key=len) if ms else None
    if kind == 'R' and d.startswith('POST') and m: last[fd] = ('c', m); steps[m]['client_read'].append(tid)
    elif kind == 'W' and d.startswith('POST') and m: last[fd] = ('u', m); steps[m]['upstream_write'].append(tid)
    elif kind == 'R' and d.startswith('HTTP/1.1') and last.get(fd, ('',))[0] == 'u': steps[last[fd][1]]['upstream_read'].append(tid)
    elif kind == 'W' and d.startswith('HTTP/1.1') and last.get(fd, ('',))[0] == 'c': steps[last[fd][1]]['client_write'].append(tid)
comp = {k: v for k, v in steps.items() if len(v) == 4}
dist = collections.Counter(len({t for s in v.values() for t in s}) for v in comp.values())
same = collections.Counter()
for v in comp.values():
    same['read==uw'] += v['client_read'][0] == v['upstream_write'][0]
    same['ur==cw'] += v['upstream_read'][0] == v['client_write'][0]
    same['cr==cw'] += v['client_read'][0] == v['client_write'][0]
print(f"events {len(evs)} requests {len(steps)} complete {len(comp)}; distinct tids per request {dict(sorted(dist.items()))}; same-tid pairs {dict(same)}; tids {len({e[0] for e in evs})}")
