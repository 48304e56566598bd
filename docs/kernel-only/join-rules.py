#!/usr/bin/env python3
"""Which thread rule would join id-less requests right? Reads a kernel-only capture taken WITH
unique x-request-ids (the truth) and, for every upstream request sent while several identical
client requests were pending, says what each rule would have picked:

  adjacent      the client request whose read came just before, on the sending thread
  fifo-thread   the oldest pending one read by the sending thread
  answer-order  the client answered first after this upstream response, on its thread

usage: join-rules.py RAW_EVENTS RAW_DATA   (tracer record --raw-events F --raw-data G)
"""
import collections, re, struct, sys

EV = struct.Struct('<QIHH3Q')
RECV = {2, 3, 4}  # read, readv, recvfrom


def body(path):
    b = open(path, 'rb').read()
    return b[b.index(b'\n') + 1:] if b.startswith(b'tracer --raw') else b


def items(events, data):
    out = []
    e = body(events)
    for i in range(0, len(e) // 40 * 40, 40):
        ts, tid, kind, sub, a0, a1, a2 = EV.unpack_from(e, i)
        if kind == 2 and sub == 8:  # SYSCALL connect
            out.append((ts, 'connect', tid, a1 & 0xffffffff, b''))
    d = body(data)
    for i in range(0, len(d) // 560 * 560, 560):
        ts, tid, kind, sub, a0, a1, a2 = EV.unpack_from(d, i)
        tgid, cap = struct.unpack_from('<II', d, i + 40)
        what = 'recv' if sub in RECV else 'send'
        out.append((ts, what, tid, a1 & 0xffffffff, d[i + 48:i + 48 + min(cap, 512, a2)]))
    return sorted(out, key=lambda x: x[0])


def main(events, data):
    line = re.compile(rb'[A-Z]+ \S+ HTTP/1\.\d\r\n')
    ident = re.compile(rb'x-request-id: *(\S+)\r\n', re.I)
    last = {}                # tid -> ('read', id) | other
    pending = []             # (id, tid) read, not yet sent upstream
    stats = collections.Counter()
    for ts, what, tid, fd, b in items(events, data):
        m = ident.search(b)
        rid = m.group(1) if m else None
        if what == 'connect':
            last[tid] = ('connect', None)
            continue
        if what == 'recv' and line.match(b):
            pending.append((rid, tid))
            last[tid] = ('read', rid)
        elif what == 'send' and line.match(b):
            if len(pending) > 1:
                stats['ambiguous sends'] += 1
                mine = [p for p in pending if p[1] == tid]
                picks = {
                    'adjacent': last.get(tid, (None, None))[1] if last.get(tid, (None,))[0] == 'read' else None,
                    'fifo-thread': mine[0][0] if mine else None,
                }
                for rule, pick in picks.items():
                    stats[f'{rule}: ' + ('none' if pick is None else 'right' if pick == rid else 'WRONG')] += 1
            pending = [p for p in pending if p[0] != rid]
            last[tid] = ('send', rid)
        else:
            last[tid] = (what, None)
    for k, v in sorted(stats.items()):
        print(f'{v:6d}  {k}')


if __name__ == '__main__':
    main(*sys.argv[1:3])
