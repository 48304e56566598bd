//! Tail pictures of a session: flamegraphs of where the slowest requests spent their time on
//! and off CPU, what held the CPU while they waited ([`wait`]), a differential graph against
//! the median band, and trace.json: the 20 slowest and 20 median requests on a timeline.
//!
//! The session pushes every complete request as it arrives ([`FlameSession::push`]); only a
//! compact spill file grows with the session (memory stays flat). At the end the tail
//! threshold and the median band are known, and [`FlameSession::finish`] reads the spill
//! once and writes every picture. See [`fold`] for the frame conventions.

pub mod fold;
pub mod phases;
pub mod render;
pub mod spill;
pub mod trace_json;
pub mod wait;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs;
use std::io::{self, BufWriter, Write};

use anyhow::{Context, Result, bail};

use crate::out_dir::OutDir;
use crate::requests::RequestRecord;
use crate::symbolize::{StackSource, Symbolizer};
use session::pictures as model;
use trace_json::{Group, ThreadNames};

use fold::{Folded, StackCounts};
use phases::PhaseSamples;
use render::Picture;
use spill::Spill;
use wait::WaitCounts;

/// How many requests of each group trace.json shows.
pub const TRACE_REQUESTS_PER_GROUP: usize = 20;

/// The tail and median bands, shared with breakdown.json's tail view (one definition).
pub use crate::report::Bands;

/// The file names a session writes.
pub mod files {
    pub const TAIL_ONCPU: &str = "tail-oncpu";
    pub const ALL_ONCPU: &str = "all-oncpu";
    pub const TAIL_OFFCPU: &str = "tail-offcpu";
    pub const TAIL_WAIT: &str = "tail-wait";
    pub const MEDIAN_ONCPU: &str = "median-oncpu";
    pub const TAIL_DIFF: &str = "tail-diff.svg";
    pub const TRACE: &str = "trace.json";
    pub const SUMMARY: &str = "pictures.json";
}

/// Collects a session's requests for the pictures.
pub struct FlameSession {
    out_dir: OutDir,
    spill: Spill,
    wait_for: bool,
    sample_hz: Option<u64>,
}

impl FlameSession {
    /// Starts a session writing into `out_dir`.
    pub fn create(out_dir: &OutDir) -> Result<Self> {
        let spill = Spill::create(out_dir).context("creating the flame spill file")?;
        Ok(FlameSession {
            out_dir: out_dir.clone(),
            spill,
            wait_for: false,
            sample_hz: None,
        })
    }

    /// The cpu-clock sampling rate, so that pictures.json can turn samples into time.
    pub fn with_sample_hz(mut self, hz: u64) -> Self {
        self.sample_hz = Some(hz);
        self
    }

    /// Also draws the wait-for view (`tail-wait`), from the records' `waits`.
    pub fn with_wait_for(mut self) -> Self {
        self.wait_for = true;
        self
    }

    /// Records one complete request; call it for every `Outcome::Complete` as it arrives.
    pub fn push(&mut self, record: &RequestRecord) -> Result<()> {
        self.spill
            .push(record)
            .context("writing the flame spill file")
    }

    pub fn requests(&self) -> u64 {
        self.spill.records()
    }

    /// Writes every picture into the output directory and removes the spill file.
    /// `stacks` must still hold the session's stacks; `symbolizer` should have snapshotted
    /// the target's maps when the session started.
    pub fn finish(
        mut self,
        bands: &Bands,
        stacks: &dyn StackSource,
        symbolizer: &mut Symbolizer,
        threads: &ThreadNames,
        tasks: &HashMap<u32, String>,
        threads_title: &str,
    ) -> Result<model::Pictures> {
        let mut all = StackCounts::default();
        let mut tail_wait = WaitCounts::default();
        let mut sample_wait = WaitCounts::default();
        let mut every_wait = WaitCounts::default();
        let mut charged = 0u64;
        let mut tail = StackCounts::default();
        let mut median = StackCounts::default();
        let mut tail_off = StackCounts::default();
        // What the pictures show, counted as they are drawn and written as pictures.json.
        let mut summary = model::Pictures {
            all_samples: 0,
            kernel_symbols: symbolizer.kernel_names(),
            median_band: model::MedianBand {
                overhead_ns: [bands.median_lo_ns, bands.median_hi_ns],
                requests: 0,
                samples: 0,
            },
            phase_samples: None,
            requests: 0,
            tail: model::Tail {
                above_overhead_ns: bands.tail_above_ns,
                offcpu_ns: 0,
                requests: 0,
                samples: 0,
            },
            trace: model::Trace {
                complete_events: 0,
                median_req_ids: Vec::new(),
                slowest_req_ids: Vec::new(),
                thread_tracks: 0,
            },
            wait: None,
            wait_all: None,
            wait_all_of: Some(None),
        };
        // Min-heaps of the best candidates so far (the worst candidate on top, to evict).
        let mut slowest: BinaryHeap<Reverse<(u64, Reverse<u64>, Keep)>> = BinaryHeap::new();
        let mut closest: BinaryHeap<(u64, u64, Keep)> = BinaryHeap::new();

        for req in self
            .spill
            .read_back()
            .context("reading the flame spill file")?
        {
            let req = req.context("reading the flame spill file")?;
            let overhead = req.overhead_ns();
            summary.requests += 1;
            summary.all_samples += req.samples.len() as u64;
            all.add_samples(&req);
            if req.waits.is_some() {
                charged += 1;
                every_wait.add(&req);
            }
            if crate::requests::wait::in_uniform_sample(req.req_id) {
                sample_wait.add(&req);
            }
            if bands.is_tail(overhead) {
                summary.tail.requests += 1;
                summary.tail.samples += req.samples.len() as u64;
                tail.add_samples(&req);
                tail_off.add_offcpu(&req);
                tail_wait.add(&req);
            }
            if bands.is_median(overhead) {
                summary.median_band.requests += 1;
                summary.median_band.samples += req.samples.len() as u64;
                median.add_samples(&req);
                let key = (overhead.abs_diff(bands.median_ns), req.req_id);
                let kept = closest.len() < TRACE_REQUESTS_PER_GROUP
                    || closest
                        .peek()
                        .is_some_and(|(distance, id, _)| key < (*distance, *id));
                if kept {
                    closest.push((key.0, key.1, Keep(req.clone())));
                    if closest.len() > TRACE_REQUESTS_PER_GROUP {
                        closest.pop();
                    }
                }
            }
            slowest.push(Reverse((overhead, Reverse(req.req_id), Keep(req))));
            if slowest.len() > TRACE_REQUESTS_PER_GROUP {
                slowest.pop();
            }
        }

        let tail_folded = tail.fold(stacks, symbolizer);
        let all_folded = all.fold(stacks, symbolizer);
        let median_folded = median.fold(stacks, symbolizer);
        let tail_off_folded = tail_off.fold(stacks, symbolizer);
        summary.tail.offcpu_ns = tail_off_folded.total();
        summary.phase_samples = Some(model::BandPhases {
            all: phase_counts(&PhaseSamples::from_folded(&all_folded)),
            median: phase_counts(&PhaseSamples::from_folded(&median_folded)),
            sample_hz: self.sample_hz,
            tail: phase_counts(&PhaseSamples::from_folded(&tail_folded)),
        });

        let tail_us = bands.tail_above_ns as f64 / 1e3;
        let (lo_us, hi_us) = (
            bands.median_lo_ns as f64 / 1e3,
            bands.median_hi_ns as f64 / 1e3,
        );
        let oncpu_note =
            "root frame = phase (cpu.<phase>); then user frames, then kernel frames (_[k])";
        self.write_pair(
            files::TAIL_ONCPU,
            &tail_folded,
            &Picture {
                title: format!(
                    "On-CPU: {} tail requests (overhead > p99 = {tail_us:.1} µs), {} samples",
                    summary.tail.requests, summary.tail.samples
                ),
                subtitle: oncpu_note.to_owned(),
                count_name: "samples",
            },
        )?;
        self.write_pair(
            files::ALL_ONCPU,
            &all_folded,
            &Picture {
                title: format!(
                    "On-CPU: all {} complete requests, {} samples",
                    summary.requests, summary.all_samples
                ),
                subtitle: oncpu_note.to_owned(),
                count_name: "samples",
            },
        )?;
        self.write_pair(
            files::TAIL_OFFCPU,
            &tail_off_folded,
            &Picture {
                title: format!(
                    "Off-CPU: {} tail requests (overhead > p99 = {tail_us:.1} µs), {:.1} ms charged",
                    summary.tail.requests,
                    summary.tail.offcpu_ns as f64 / 1e6
                ),
                subtitle: "root frame = part charged; stack at switch-out; ledger-writer;fdatasync|sign = \
                           writer time with no switch-out stack"
                    .to_owned(),
                count_name: "ns",
            },
        )?;
        if self.wait_for {
            let tail_wait_folded = tail_wait.fold(stacks, symbolizer, threads, tasks);
            let wait = tail_wait.summary(threads, tasks);
            let uncovered = wait.scheduling_ns.abs_diff(tail_wait_folded.total());
            self.write_pair(
                files::TAIL_WAIT,
                &tail_wait_folded,
                &Picture {
                    title: format!(
                        "While {} tail requests waited for the CPU ({:.1} ms of scheduling): what ran instead",
                        summary.tail.requests,
                        wait.scheduling_ns as f64 / 1e6
                    ),
                    subtitle: format!(
                        "root = waiter's part; then the holder; then its stack where a sample of it fell inside; \
                         {:.1} ms charged, {:.1} ms on an unseen CPU, {:.1} ms not charged",
                        tail_wait_folded.total() as f64 / 1e6,
                        wait.unknown_ns as f64 / 1e6,
                        uncovered as f64 / 1e6
                    ),
                    count_name: "ns",
                },
            )?;
            summary.wait = Some(wait);
            // A short session charges every request: then all of them are the fairer sample
            // (a 1-in-16 sample of a few hundred requests can be empty).
            let (all_wait, of) = if charged == summary.requests {
                (every_wait, "every request")
            } else {
                (sample_wait, "a uniform 1-in-16 sample")
            };
            summary.wait_all = Some(all_wait.summary(threads, tasks));
            summary.wait_all_of = Some(Some(of.to_owned()));
        }
        self.out_dir.write(
            &format!("{}.folded", files::MEDIAN_ONCPU),
            median_folded.to_text().as_bytes(),
        )?;
        let diff = Picture {
            title: format!(
                "On-CPU, tail ({} requests > p99) vs median band ({} requests, p45..p55 = {lo_us:.1}..{hi_us:.1} µs)",
                summary.tail.requests, summary.median_band.requests
            ),
            subtitle: "widths: tail samples; red = larger share in the tail than in the median band, blue = smaller \
                       (median scaled to the tail's total)"
                .to_owned(),
            count_name: "samples",
        };
        write_file(&self.out_dir, files::TAIL_DIFF, |out| {
            render::differential_svg(&diff, &median_folded, &tail_folded, out)
        })?;

        let mut slowest: Vec<_> = slowest
            .into_iter()
            .map(|Reverse((o, Reverse(id), Keep(r)))| (o, id, r))
            .collect();
        slowest.sort_by_key(|(o, id, _)| (Reverse(*o), *id));
        let mut closest: Vec<_> = closest.into_iter().collect();
        closest.sort_by_key(|(distance, id, _)| (*distance, *id));
        summary.trace.slowest_req_ids = slowest.iter().map(|(_, id, _)| *id).collect();
        summary.trace.median_req_ids = closest.iter().map(|(_, id, _)| *id).collect();
        let selected: Vec<(Group, &RequestRecord)> = slowest
            .iter()
            .map(|(_, _, r)| (Group::Slowest, r))
            .chain(closest.iter().map(|(_, _, Keep(r))| (Group::Median, r)))
            .collect();
        let trace = self.out_dir.create_file(files::TRACE)?;
        let written = trace_json::write_trace(trace, &selected, threads, threads_title)
            .context("writing trace.json")?;
        summary.trace.thread_tracks = written.thread_tracks as u64;
        summary.trace.complete_events = written.events as u64;

        let mut json = serde_json::to_string_pretty(&summary).expect("pictures.json serializes");
        json.push('\n');
        self.out_dir.write(files::SUMMARY, json.as_bytes())?;
        Ok(summary)
    }

    fn write_pair(&self, stem: &str, folded: &Folded, picture: &Picture) -> Result<()> {
        self.out_dir
            .write(&format!("{stem}.folded"), folded.to_text().as_bytes())?;
        write_file(&self.out_dir, &format!("{stem}.svg"), |out| {
            render::svg(picture, folded, out)
        })
    }
}

/// Everything `tracer record` needs for the pictures, in three calls: [`Pictures::start`] when
/// attaching (snapshots the target's maps and thread names while it surely runs),
/// [`Pictures::push`] for each complete request, [`Pictures::finish`] after the last one.
pub struct Pictures {
    session: FlameSession,
    symbolizer: Symbolizer,
    threads: ThreadNames,
    /// The traced processes (kernel-only mode follows a master's workers).
    pids: Vec<u32>,
    threads_title: String,
}

impl Pictures {
    /// `pids`: the traced processes, the first one's mappings used for symbols.
    /// `wait_for`: also draw the wait-for view (the records carry their waits).
    /// `sample_hz`: the session's cpu-clock sampling rate.
    pub fn start(pids: &[u32], out_dir: &OutDir, wait_for: bool, sample_hz: u64) -> Result<Self> {
        let &[pid, ..] = pids else {
            bail!("no process to draw");
        };
        let session = FlameSession::create(out_dir)?;
        // No rate with sampling off: pictures.json turns samples into time with it.
        let session = match sample_hz {
            0 => session,
            hz => session.with_sample_hz(hz),
        };
        let symbolizer =
            Symbolizer::for_process(pid).context("snapshotting the target's mappings")?;
        // Once a session: the frames are right, but tools run in the tracer's namespace are not.
        if let [first, rest @ ..] = symbolizer.other_builds() {
            say!(
                "tracer: WARNING {} of the target's mapped files differ from the files at their \
                 paths in the tracer's mount namespace, first {first}; frames are named from the \
                 target's files",
                rest.len() + 1
            );
        }
        Ok(Pictures {
            session: if wait_for {
                session.with_wait_for()
            } else {
                session
            },
            symbolizer,
            threads: trace_json::read_thread_names(pids),
            pids: pids.to_vec(),
            threads_title: trace_json::threads_title(pids),
        })
    }

    pub fn push(&mut self, record: &RequestRecord) -> Result<()> {
        self.session.push(record)
    }

    /// Draws every picture. `stacks` is the session's stacks map (it outlives detach).
    /// `tasks`: names of the tasks outside the target that took its CPU (the rebuild's).
    pub fn finish(
        mut self,
        bands: &Bands,
        stacks: &dyn StackSource,
        tasks: &HashMap<u32, String>,
    ) -> Result<model::Pictures> {
        // Threads started after attach (or renamed) are named too, if the target still runs.
        self.threads
            .extend(trace_json::read_thread_names(&self.pids));
        self.session.finish(
            bands,
            stacks,
            &mut self.symbolizer,
            &self.threads,
            tasks,
            &self.threads_title,
        )
    }
}

fn write_file(
    dir: &OutDir,
    name: &str,
    render: impl FnOnce(&mut BufWriter<fs::File>) -> io::Result<()>,
) -> Result<()> {
    let mut out = BufWriter::new(dir.create_file(name)?);
    render(&mut out)
        .and_then(|()| out.flush())
        .with_context(|| format!("writing {}", dir.path().join(name).display()))
}

fn phase_counts(counts: &PhaseSamples) -> model::PhaseCounts {
    model::PhaseCounts {
        samples: counts.samples,
        phases: (tracer_ebpf::sites::Phase::ALL.into_iter())
            .map(|phase| (phase.name().to_owned(), counts.phase(phase)))
            .collect(),
        outside: counts.outside,
        unresolved: counts.unresolved,
    }
}

/// A request ordered by nothing: heaps order by the keys beside it.
struct Keep(RequestRecord);

impl PartialEq for Keep {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Keep {}
impl PartialOrd for Keep {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Keep {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}
