#!/usr/bin/env python3
"""Checks a kernel-only session's joins against what the client and the upstream saw, as
tracer/tests/e2e_proxies.rs does: each traced request is matched to the client's request on
its connection (client_port) whose send-receive window holds it, and its upstream part must
hold mock-upstream's own [received, answered] for that request (loadgen --body-pad puts the
id past the captured bytes; mock-upstream --log-requests logs it).

usage: join-check.py CLIENT_CSV MOCK_CSV SESSION_DIR
       join-check.py --tail SESSION_DIR   (each part's share of the tail, breakdown.json)
"""
import collections, csv, json, sys


def tail(session):
    t = json.load(open(session + '/breakdown.json'))['tail']
    shares = [f'{k} {v["share"]:.1%}' for k, v in t['parts'].items() if v['share']]
    print(f'tail above the p99 of overhead ({t["requests"]} requests):', ', '.join(shares))


def main(client_csv, mock_csv, session):
    client = [r for r in csv.DictReader(open(client_csv)) if r['status'] == '200']
    mock = {r['request_id']: r for r in csv.DictReader(open(mock_csv))}
    traced = list(csv.DictReader(open(session + '/requests.csv')))
    incomplete = list(csv.DictReader(open(session + '/incomplete.csv')))
    by_port = collections.defaultdict(list)
    for c in client:
        by_port[c['local_port']].append(c)
    right = wrong = unmatched = 0
    for t in traced:
        a, d = int(t['t_arrive_ns']), int(t['t_done_ns'])
        cs = [c for c in by_port.get(t['client_port'], [])
              if int(c['sent_ns']) <= a and d <= int(c['received_ns'])]
        if len(cs) != 1:
            unmatched += 1
            continue
        m = mock[cs[0]['request_id']]
        s, u = int(t['t_upstream_ns']), int(t['upstream_ns'])
        if s <= int(m['received_ns']) and int(m['answered_ns']) <= s + u:
            right += 1
        else:
            wrong += 1
    reasons = collections.Counter(r['reason'] for r in incomplete)
    print(f'200s {len(client)}, complete {len(traced)} ({100 * len(traced) / max(1, len(client)):.2f}%), '
          f'joins right {right}, wrong {wrong}, unmatched {unmatched}; incomplete {dict(reasons)}')


if __name__ == '__main__':
    if sys.argv[1] == '--tail':
        tail(sys.argv[2])
    else:
        main(*sys.argv[1:4])
