//! The matcher on scripted times: ids, candidates, the answers' order, threads.

use super::*;

/// On thread 1.
fn at(ns: u64) -> At {
    At { ns, tid: 1 }
}

fn line() -> Line {
    Line {
        tgid: 1,
        method: "POST".into(),
        target: "/".into(),
    }
}

fn id(s: &str) -> Option<Result<RequestId, BadId>> {
    Some(Ok(s.into()))
}

#[test]
fn one_candidate_joins_at_once() {
    let mut m = Matcher::default();
    m.client(1, line(), None, at(10));
    assert_eq!(
        m.upstream(2, line(), None, at(20)),
        Sent::Joined(1, By::OnlyCandidate)
    );
    assert_eq!(m.client_ended(1), Standing::Joined);
}

/// A and B read together and sent together; B's upstream answers first and B is answered
/// before A's upstream answers: the times say which is which.
#[test]
fn the_answers_order_tells_identical_requests_apart() {
    let mut m = Matcher::default();
    m.client(1, line(), None, at(10));
    m.client(2, line(), None, at(11));
    assert_eq!(m.upstream(3, line(), None, at(20)), Sent::Waiting);
    assert_eq!(m.upstream(4, line(), None, at(21)), Sent::Waiting);
    m.upstream_answered(4, at(100));
    m.client_answered(2, at(110));
    m.upstream_answered(3, at(200));
    m.client_answered(1, at(210));
    let mut d = m.take();
    d.sort_by_key(|d| format!("{d:?}"));
    assert_eq!(
        d,
        [
            Decision::Joined {
                upstream: 3,
                client: 1,
                by: By::Time
            },
            Decision::Joined {
                upstream: 4,
                client: 2,
                by: By::Time
            }
        ]
    );
    assert_eq!(m.client_ended(1), Standing::Joined);
    assert_eq!(m.client_ended(2), Standing::Joined);
    assert_eq!((m.undecided(), m.clients()), (0, 0));
}

/// Both upstream answers arrive before either client is answered: nothing tells.
#[test]
fn what_the_times_cannot_tell_is_ambiguous() {
    let mut m = Matcher::default();
    m.client(1, line(), None, at(10));
    m.client(2, line(), None, at(11));
    m.upstream(3, line(), None, at(20));
    m.upstream(4, line(), None, at(21));
    m.upstream_answered(3, at(100));
    m.upstream_answered(4, at(101));
    m.client_answered(1, at(110));
    assert_eq!(m.client_ended(1), Standing::Undecided);
    m.client_answered(2, at(111));
    // Only threads could tell, and the process has not shown whether it keeps a request on
    // one: the group waits, then is ambiguous.
    assert!(m.take().is_empty());
    m.tick(111 + PARK_NS - 1);
    assert!(m.take().is_empty());
    m.tick(111 + PARK_NS);
    let d = m.take();
    assert!(d.contains(&Decision::Ambiguous(1)) && d.contains(&Decision::Ambiguous(2)));
    assert!(d.contains(&Decision::Failed {
        upstream: 3,
        why: Failure::Ambiguous
    }));
    assert_eq!(m.client_ended(2), Standing::Ambiguous);
    assert_eq!((m.undecided(), m.clients()), (0, 0));
}

/// Three pending, two sent: the third answered early (the proxy answered it itself) and
/// drops out; the two left are told apart by their answers.
#[test]
fn a_request_answered_by_the_proxy_drops_out() {
    let mut m = Matcher::default();
    for (s, t) in [(1, 10), (2, 11), (3, 12)] {
        m.client(s, line(), None, at(t));
    }
    m.upstream(4, line(), None, at(20));
    m.upstream(5, line(), None, at(21));
    m.client_answered(3, at(30));
    assert_eq!(m.client_ended(3), Standing::Free);
    m.upstream_answered(5, at(100));
    m.client_answered(2, at(101));
    m.upstream_answered(4, at(200));
    m.client_answered(1, at(201));
    assert_eq!(m.client_ended(1), Standing::Joined);
    assert_eq!(m.client_ended(2), Standing::Joined);
}

#[test]
fn ids_join_and_duplicates_join_nothing() {
    let mut m = Matcher::default();
    assert_eq!(m.client(1, line(), id("a"), at(10)), IdVerdict::Ok);
    assert_eq!(
        m.upstream(2, line(), id("a"), at(20)),
        Sent::Joined(1, By::Id)
    );
    assert_eq!(m.upstream(3, line(), id("a"), at(30)), Sent::Retry(1));
    assert_eq!(m.client(4, line(), id("b"), at(40)), IdVerdict::Ok);
    assert_eq!(m.client(5, line(), id("b"), at(41)), IdVerdict::Duplicate);
    assert_eq!(
        m.upstream(6, line(), id("b"), at(50)),
        Sent::Failed(Failure::DuplicateId)
    );
    // A proxy-made id is joined by its line.
    m.client(7, line(), None, at(60));
    assert_eq!(
        m.upstream(8, line(), id("nginx-made"), at(61)),
        Sent::Joined(7, By::OnlyCandidate)
    );
    assert_eq!(
        m.client(9, line(), Some(Err(BadId)), at(70)),
        IdVerdict::Bad
    );
    // A finished id again is a duplicate.
    m.client_answered(1, at(80));
    m.client_ended(1);
    assert_eq!(m.client(10, line(), id("a"), at(90)), IdVerdict::Duplicate);
}

#[test]
fn unjoined_upstream_traffic_is_remembered_for_its_window() {
    let mut m = Matcher::default();
    assert_eq!(
        m.upstream(1, line(), None, at(50)),
        Sent::Failed(Failure::NoCandidate)
    );
    assert!(m.unaccounted_between(1, 40, 60));
    assert!(!m.unaccounted_between(1, 51, 60));
    assert!(!m.unaccounted_between(2, 40, 60));
    m.prune(51);
    assert!(!m.unaccounted_between(1, 0, 100));
}

fn on(ns: u64, tid: u32) -> At {
    At { ns, tid }
}

/// `n` requests of one line, each alone: read, sent, answered upstream and to the client on
/// thread `tid` (or, if `moved`, the upstream request sent by another thread).
fn joins_alone(m: &mut Matcher, from: Serial, n: u64, tid: u32, moved: bool) {
    for i in 0..n {
        let (c, u, t) = (from + 2 * i, from + 2 * i + 1, 1_000 * (from + i));
        m.client(c, line(), None, on(t, tid));
        let sender = if moved { tid + 1 } else { tid };
        assert!(matches!(
            m.upstream(u, line(), None, on(t + 10, sender)),
            Sent::Joined(..)
        ));
        m.upstream_answered(u, on(t + 100, tid));
        m.client_answered(c, on(t + 110, tid));
        assert_eq!(m.client_ended(c), Standing::Joined);
    }
}

/// Two identical requests read by threads 1 and 2, each sent upstream by its reader, in the
/// other order; both upstream answers back before either client is answered. The times cannot tell; the threads can, once the process showed it keeps a
/// request on one thread, and only then.
fn two_threads(m: &mut Matcher, base: Serial) -> Vec<Decision> {
    let t = 1_000_000 * base;
    m.client(base, line(), None, on(t, 1));
    m.client(base + 1, line(), None, on(t + 1, 2));
    m.upstream(base + 2, line(), None, on(t + 10, 2));
    m.upstream(base + 3, line(), None, on(t + 11, 1));
    m.upstream_answered(base + 2, on(t + 100, 2));
    m.upstream_answered(base + 3, on(t + 101, 1));
    m.client_answered(base, on(t + 110, 1));
    m.client_answered(base + 1, on(t + 111, 2));
    m.client_ended(base);
    m.client_ended(base + 1);
    m.take()
}

#[test]
fn threads_decide_only_in_a_process_that_keeps_requests_on_one_thread() {
    let joined_by_threads = |d: &[Decision], base: Serial| {
        d.contains(&Decision::Joined {
            upstream: base + 2,
            client: base + 1,
            by: By::Thread,
        }) && d.contains(&Decision::Joined {
            upstream: base + 3,
            client: base,
            by: By::Thread,
        })
    };
    // Not yet shown: the group waits for the evidence, which then decides it.
    let mut m = Matcher::default();
    assert!(two_threads(&mut m, 1).is_empty());
    joins_alone(&mut m, 100, AFFINITY_EVIDENCE / 2, 1, false);
    assert!(m.thread_affine(1));
    assert!(joined_by_threads(&m.take(), 1));
    // Shown: decided at once.
    let d = two_threads(&mut m, 1_000);
    assert!(joined_by_threads(&d, 1_000), "{d:?}");
    // One join whose upstream request another thread sent: threads never decide again.
    joins_alone(&mut m, 2_000, 1, 1, true);
    assert!(!m.thread_affine(1));
    let d = two_threads(&mut m, 3_000);
    assert!(d.contains(&Decision::Ambiguous(3_000)), "{d:?}");
}

/// On one thread of an event loop: two read, two sent, both answers back before either client
/// is answered. The order out and the order back pair them the same way: joined. When the two
/// orders disagree, nothing is.
#[test]
fn on_one_thread_the_orders_out_and_back_must_agree() {
    let mut m = Matcher::default();
    joins_alone(&mut m, 100, AFFINITY_EVIDENCE / 2, 1, false);
    m.take();
    let run = |m: &mut Matcher, base: Serial, back: [Serial; 2]| {
        let t = 1_000_000 * base;
        m.client(base, line(), None, on(t, 1));
        m.client(base + 1, line(), None, on(t + 1, 1));
        m.upstream(base + 2, line(), None, on(t + 10, 1));
        m.upstream(base + 3, line(), None, on(t + 11, 1));
        m.upstream_answered(base + back[0], on(t + 100, 1));
        m.upstream_answered(base + back[1], on(t + 101, 1));
        m.client_answered(base, on(t + 110, 1));
        m.client_answered(base + 1, on(t + 111, 1));
        m.client_ended(base);
        m.client_ended(base + 1);
        m.take()
    };
    let d = run(&mut m, 1_000, [2, 3]);
    assert!(
        d.contains(&Decision::Joined {
            upstream: 1_002,
            client: 1_000,
            by: By::Thread
        }),
        "{d:?}"
    );
    let d = run(&mut m, 2_000, [3, 2]);
    assert!(d.contains(&Decision::Ambiguous(2_000)), "{d:?}");
}

/// A group becomes final when the last client it waited for leaves it (joined elsewhere): it
/// is decided then, not left undecided until the session ends.
#[test]
fn a_group_is_decided_when_its_last_open_candidate_leaves_it() {
    let mut m = Matcher::default();
    // A process known not to keep requests on one thread: nothing parks.
    joins_alone(&mut m, 100, 1, 1, true);
    m.take();
    m.client(1, line(), None, at(1_000));
    m.client(2, line(), None, at(1_001));
    m.upstream(10, line(), None, at(1_010));
    m.client(3, line(), None, at(1_011));
    m.upstream(11, line(), None, at(1_012));
    m.upstream_answered(10, at(1_040));
    m.upstream_answered(11, at(1_041));
    m.client_answered(1, at(1_045));
    m.client_answered(2, at(1_046));
    // 3 is the only one pending now: the next upstream request is its, and 3 leaves 11.
    assert_eq!(
        m.upstream(12, line(), None, at(1_050)),
        Sent::Joined(3, By::OnlyCandidate)
    );
    let d = m.take();
    assert!(
        d.contains(&Decision::Ambiguous(1)) && d.contains(&Decision::Ambiguous(2)),
        "{d:?}"
    );
    assert_eq!(m.undecided(), 0);
}
