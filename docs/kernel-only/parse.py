#!/usr/bin/env python3
"""Stitch strace -f output, classify per request: which tid did client-read, upstream-write,
upstream-read, client-write. Usage: parse.py FILE UPSTREAM_PORT_FDS_AUTO"""
import re, sys, collections
lines = open(sys.argv[1]).read().splitlines()
pending = {}
calls = []
for l in lines:
    m = re.match(r'(\d+)\s+(?:[\d:.]+\s+)?(.*)$', l)
    if not m: continue
    tid, rest = int(m.group(1)), m.group(2)
    if rest.endswith('<unfinished ...>'):
        pending[tid] = rest[:-len('<unfinished ...>')]; continue
    r = re.match(r'<\.\.\. (\w+) resumed>(.*)$', rest)
    if r:
        rest = pending.pop(tid, r.group(1) + '(?, ') + r.group(2)
    calls.append((tid, rest))
rid = re.compile(r'x-request-id: (\d+)', re.I)
sc = collections.Counter()
last_on_fd = {}
steps = collections.defaultdict(dict)  # id -> step -> set(tid)
for tid, c in calls:
    m = re.match(r'(\w+)\((\d+), (.*)\) = (-?\d+)', c)
    if not m: continue
    name, fd, body, ret = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
    if ret <= 0: continue
    sc[name] += 1
    if name in ('read','recvfrom','readv','recvmsg'):
        i = rid.search(body)
        if body.startswith('"POST') or body.startswith('[{iov_base="POST'):
            if i: last_on_fd[fd] = ('c', i.group(1)); steps[i.group(1)].setdefault('client_read', []).append(tid)
        elif 'HTTP/1.1 200' in body[:40] and fd in last_on_fd and last_on_fd[fd][0] == 'u':
            steps[last_on_fd[fd][1]].setdefault('upstream_read', []).append(tid)
    elif name in ('write','writev','sendto','sendmsg'):
        i = rid.search(body)
        if 'POST /echo' in body[:40]:
            if i: last_on_fd[fd] = ('u', i.group(1)); steps[i.group(1)].setdefault('upstream_write', []).append(tid)
        elif 'HTTP/1.1 200' in body[:40] and fd in last_on_fd and last_on_fd[fd][0] == 'c':
            steps[last_on_fd[fd][1]].setdefault('client_write', []).append(tid)
complete = {k: v for k, v in steps.items() if len(v) == 4}
dist = collections.Counter(len({t for s in v.values() for t in s}) for v in complete.values())
multi = collections.Counter(k for v in complete.values() for k, s in v.items() if len(s) > 1)
print(f"requests seen {len(steps)} complete {len(complete)}; distinct tids per request: {dict(sorted(dist.items()))}; steps split over >1 syscall: {dict(multi)}")
print("all tids:", len({t for t, _ in calls}), " syscalls with data:", dict(sc))
for k in list(complete)[:5]:
    print(k, complete[k])
