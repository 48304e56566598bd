//! The sampled per-phase split against the exact one on the same synthetic stream: every
//! request runs its nine phases on one worker, with the `phase` sites (the exact split) and a
//! cpu-clock sample every `PERIOD` ns whose user stack holds the gateway's real phase frame
//! for the phase in force. The rebuild gives the exact `cpu.<phase>` parts; the pictures give
//! the sampled counts (pictures.json `phase_samples`), through the real symbolizer.

mod xorshift;

use std::collections::HashMap;
use std::fs;

use gateway::probe;
use tracer::flame::trace_json::ThreadNames;
use tracer::flame::{Bands, FlameSession};
use tracer::requests::synthetic::{Stream, assert_consistent};
use tracer::requests::{Outcome, Part, RequestRecord};
use tracer::symbolize::Symbolizer;
use tracer_ebpf::abi::{Event, kind};
use tracer_ebpf::sites::Phase;
use xorshift::Rng;

const WORKER: u32 = 101;
const REQUESTS: u64 = 400;
/// ns between samples; the phases last 5..200 µs, a few samples each.
const PERIOD: u64 = 10_000;
/// The user stack of a sample outside every phase frame.
const OUTSIDE_STACK: i64 = 99;

#[inline(never)]
fn phase_work(x: u64) -> u64 {
    std::hint::black_box(x).rotate_left(3)
}

fn frame_address(phase: Phase) -> u64 {
    let frame: extern "Rust" fn(&mut dyn FnMut()) = match phase {
        Phase::Parse => probe::gw_phase_parse,
        Phase::Auth => probe::gw_phase_auth,
        Phase::Scope => probe::gw_phase_scope,
        Phase::RateLimit => probe::gw_phase_ratelimit,
        Phase::Registry => probe::gw_phase_registry,
        Phase::Vault => probe::gw_phase_vault,
        Phase::Upstream => probe::gw_phase_upstream,
        Phase::ReceiptWait => probe::gw_phase_receipt,
        Phase::Respond => probe::gw_phase_respond,
    };
    frame as usize as u64
}

fn phase_stack(phase: Phase) -> i64 {
    100 + phase as i64
}

/// Stacks innermost first, as bpf_get_stack gives them: the leaf, then a return address a
/// few bytes into the phase frame (past its prologue, at its call).
fn stacks() -> HashMap<i64, Vec<u64>> {
    let leaf = phase_work as fn(u64) -> u64 as usize as u64;
    assert_ne!(phase_work(1), 0);
    let mut stacks: HashMap<i64, Vec<u64>> = Phase::ALL
        .into_iter()
        .map(|p| (phase_stack(p), vec![leaf + 1, frame_address(p) + 8]))
        .collect();
    stacks.insert(OUTSIDE_STACK, vec![leaf + 1]);
    stacks
}

fn sample(s: &mut Stream, ts: u64, user_stack: i64) {
    s.raw(Event {
        ts_ns: ts,
        tid: WORKER,
        kind: kind::SAMPLE,
        sub: 0,
        args: [u64::MAX, user_stack as u64, 0],
    });
}

/// The stream, and the ns each phase lasted in all (what the sites bound).
fn stream(rng: &mut Rng) -> (Stream, HashMap<Phase, u64>) {
    let mut s = Stream::new();
    let mut truth: HashMap<Phase, u64> = HashMap::new();
    // The sampling clock runs on its own; each request starts at an unrelated offset.
    let mut next_sample = 0;
    let mut t0 = 1_000_000;
    for req in 1..=REQUESTS {
        let (fd, sk) = (1000 + req, 0xc000 + req);
        s.data_ready(t0, sk)
            .sock_fd(t0 + 5, WORKER, sk, fd)
            .recv(t0, t0 + 10, WORKER, fd, 100)
            .request_begin(t0 + 100, WORKER, req, fd);
        let mut at = t0 + 100;
        for phase in Phase::ALL {
            let len = rng.range(5_000, 200_000);
            s.phase(at, WORKER, req, phase);
            while next_sample < at {
                next_sample += PERIOD;
            }
            while next_sample < at + len {
                sample(&mut s, next_sample, phase_stack(phase));
                next_sample += PERIOD;
            }
            *truth.entry(phase).or_default() += len;
            at += len;
        }
        s.request_end(at, WORKER, req, 200)
            .send(at + 1, at + 2, WORKER, fd, 100);
        t0 = at + rng.range(1_000, 50_000);
    }
    (s, truth)
}

#[test]
fn sampled_phases_agree_with_the_exact_split_within_the_sampling_bound() {
    let (s, truth) = stream(&mut Rng(0x9e37_79b9_7f4a_7c15));
    let records: Vec<RequestRecord> = s
        .rebuild()
        .into_iter()
        .map(|o| match o {
            Outcome::Complete(r) => r,
            Outcome::Incomplete(i) => panic!("incomplete: {i:?}"),
        })
        .collect();
    assert_eq!(records.len() as u64, REQUESTS);

    let dir = tempfile::tempdir().unwrap();
    let out = tracer::out_dir::OutDir::open_for(dir.path(), false, None).unwrap();
    let mut session = FlameSession::create(&out)
        .unwrap()
        .with_sample_hz(1_000_000_000 / PERIOD);
    for r in &records {
        assert_consistent(r);
        session.push(r).unwrap();
    }
    let overheads: Vec<u64> = records.iter().map(RequestRecord::overhead_ns).collect();
    let bands = Bands::nearest_rank(&overheads).unwrap();
    let mut symbolizer = Symbolizer::for_process(std::process::id()).unwrap();
    session
        .finish(
            &bands,
            &stacks(),
            &mut symbolizer,
            &ThreadNames::from([(WORKER, "tokio-rt-worker".to_owned())]),
            &HashMap::new(),
            "gateway threads (pid 4242)",
        )
        .unwrap();
    let pictures: session::pictures::Pictures =
        serde_json::from_slice(&fs::read(dir.path().join("pictures.json")).unwrap()).unwrap();
    let sampled = pictures.phase_samples.unwrap();
    assert_eq!(sampled.sample_hz, Some(1_000_000_000 / PERIOD));
    let all = &sampled.all;
    assert_eq!(all.unresolved, 0, "every stack names its frames: {all:?}");
    assert_eq!(all.outside, 0, "every sample fell in a phase: {all:?}");

    let exact_total: u64 = Phase::ALL
        .into_iter()
        .map(|p| records.iter().map(|r| r.part_ns(Part::Cpu(p))).sum::<u64>())
        .sum();
    let samples = all.samples;
    for phase in Phase::ALL {
        let exact: u64 = records.iter().map(|r| r.part_ns(Part::Cpu(phase))).sum();
        // The exact split bounds the phases by the same sites; parse also holds the 100 ns
        // from the read's start to request_begin, respond the 1 ns from request_end to the write.
        assert!(
            (0..=100 * REQUESTS).contains(&(exact - truth[&phase])),
            "{phase:?}: exact {exact} ns, generated {} ns",
            truth[&phase]
        );
        let count = all.phases[phase.name()];
        let estimate = count * PERIOD;
        // Each of the phase's intervals holds floor or ceil of its length over the period.
        assert!(
            estimate.abs_diff(exact) <= PERIOD * REQUESTS,
            "{phase:?}: sampled {estimate} ns against exact {exact} ns"
        );
        // The intervals start at offsets unrelated to the sampling clock, so the errors
        // average out: the shares agree within a percentage point.
        let share_exact = exact as f64 / exact_total as f64;
        let share_sampled = count as f64 / samples as f64;
        assert!(
            (share_exact - share_sampled).abs() < 0.01,
            "{phase:?}: sampled share {share_sampled:.4} against exact {share_exact:.4}"
        );
    }
}
