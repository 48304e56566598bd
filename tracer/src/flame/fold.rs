//! Folded stacks (`frame;frame;frame count`, one line per distinct stack), as inferno and
//! Brendan Gregg's flamegraph.pl read them.
//!
//! Frame conventions (outermost first):
//! - on-CPU: `cpu.<phase>` (the part the sample's ns belong to), then the user stack, then
//!   the kernel stack (frames ending in `_[k]`). The phase is the root so that each phase is
//!   one tower and the tail and median graphs compare phase by phase.
//! - off-CPU: the part the blocked ns were charged to (`scheduling`, `blocked_other`,
//!   `ledger_fsync`, `signing`), then the stack at switch-out. Ledger time that no switch-out
//!   with a stack explains (the writer inside fdatasync without being switched out, and
//!   signing, which is on-CPU work of the writer) gets the synthetic frames
//!   `ledger-writer;fdatasync` and `ledger-writer;sign`, so those towers sum to the part's ns.
//! - a sample with no phase (phases not traced, or before the first phase site) has the root
//!   `cpu`, the part its time goes to.
//! - a sample or switch-out whose stacks were not taken or are no longer in the map:
//!   `[no stack]`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::str::FromStr;

use crate::requests::{Part, RequestRecord};
use crate::symbolize::{StackSource, Symbolizer};

/// Frames for ledger time no switch-out stack explains.
pub const WRITER_FSYNC_FRAMES: &str = "ledger-writer;fdatasync";
pub const WRITER_SIGN_FRAMES: &str = "ledger-writer;sign";
pub const NO_STACK: &str = "[no stack]";

/// A stack before symbolization: the root part and the two stack ids, or a synthetic one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum RawStack {
    Ids {
        root: &'static str,
        kernel: i64,
        user: i64,
    },
    Synthetic {
        root: &'static str,
        frames: &'static str,
    },
}

/// Counts per raw stack; symbolized once at the end, so each distinct stack is resolved once.
#[derive(Default)]
pub struct StackCounts {
    counts: HashMap<RawStack, u64>,
}

impl StackCounts {
    /// Adds every on-CPU sample of `req`, one count each.
    pub fn add_samples(&mut self, req: &RequestRecord) {
        for sample in &req.samples {
            let root = sample.phase.map_or(Part::OnCpu, Part::Cpu).name();
            let raw = RawStack::Ids {
                root,
                kernel: sample.kernel_stack,
                user: sample.user_stack,
            };
            *self.counts.entry(raw).or_default() += 1;
        }
    }

    /// Adds the off-CPU ns of `req`: each switch-out by its stack, and the ledger ns that no
    /// switch-out covers under the writer's synthetic frames.
    pub fn add_offcpu(&mut self, req: &RequestRecord) {
        let mut covered = [0u64; 2];
        for off in &req.offcpu {
            if off.ns == 0 {
                continue;
            }
            let raw = if off.kernel_stack < 0 && off.user_stack < 0 {
                let frames = match off.part {
                    Part::LedgerFsync => WRITER_FSYNC_FRAMES,
                    Part::Signing => WRITER_SIGN_FRAMES,
                    _ => NO_STACK,
                };
                RawStack::Synthetic {
                    root: off.part.name(),
                    frames,
                }
            } else {
                RawStack::Ids {
                    root: off.part.name(),
                    kernel: off.kernel_stack,
                    user: off.user_stack,
                }
            };
            *self.counts.entry(raw).or_default() += off.ns;
            match off.part {
                Part::LedgerFsync => covered[0] += off.ns,
                Part::Signing => covered[1] += off.ns,
                _ => {}
            }
        }
        for ((part, frames), covered) in [
            (Part::LedgerFsync, WRITER_FSYNC_FRAMES),
            (Part::Signing, WRITER_SIGN_FRAMES),
        ]
        .into_iter()
        .zip(covered)
        {
            let rest = req.part_ns(part).saturating_sub(covered);
            if rest > 0 {
                *self
                    .counts
                    .entry(RawStack::Synthetic {
                        root: part.name(),
                        frames,
                    })
                    .or_default() += rest;
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Symbolizes every stack and merges stacks that resolve to the same frames.
    pub fn fold(&self, stacks: &dyn StackSource, symbolizer: &mut Symbolizer) -> Folded {
        let mut folded = Folded::default();
        for (raw, count) in &self.counts {
            let line = match *raw {
                RawStack::Ids { root, kernel, user } => {
                    let frames = symbolizer.stack(stacks, kernel, user);
                    format!("{root};{}", frames.as_deref().unwrap_or(NO_STACK))
                }
                RawStack::Synthetic { root, frames } => format!("{root};{frames}"),
            };
            *folded.stacks.entry(line).or_default() += count;
        }
        folded
    }
}

/// Symbolized folded stacks in a deterministic (sorted) order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Folded {
    stacks: BTreeMap<String, u64>,
}

impl Folded {
    pub fn total(&self) -> u64 {
        self.stacks.values().sum()
    }

    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }

    /// One `stack count` line per distinct stack.
    pub fn lines(&self) -> Vec<String> {
        self.stacks
            .iter()
            .map(|(stack, count)| format!("{stack} {count}"))
            .collect()
    }

    pub fn to_text(&self) -> String {
        let mut text = String::new();
        for (stack, count) in &self.stacks {
            let _ = writeln!(text, "{stack} {count}");
        }
        text
    }

    /// Every stack (`a;b;c`) with its count, in sorted order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.stacks
            .iter()
            .map(|(stack, count)| (stack.as_str(), *count))
    }

    /// Adds `count` to one folded stack (`a;b;c`).
    pub fn add(&mut self, stack: &str, count: u64) {
        *self.stacks.entry(stack.to_owned()).or_default() += count;
    }

    /// The count of every stack whose frames include `frame`.
    pub fn count_with_frame(&self, frame: &str) -> u64 {
        self.stacks
            .iter()
            .filter(|(stack, _)| stack.split(';').any(|f| f == frame))
            .map(|(_, count)| count)
            .sum()
    }
}

impl FromStr for Folded {
    type Err = String;

    /// Parses folded text; every non-empty line must be `stack count`.
    fn from_str(text: &str) -> Result<Self, String> {
        let mut folded = Folded::default();
        for (number, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let (stack, count) = line
                .trim_end()
                .rsplit_once(' ')
                .ok_or_else(|| format!("line {}: no count", number + 1))?;
            let count = count
                .parse()
                .map_err(|_| format!("line {}: bad count {count:?}", number + 1))?;
            folded.add(stack, count);
        }
        Ok(folded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requests::{Hits, OffCpu, PARTS, StackSample};
    use crate::symbolize::ProcessMaps;
    use tracer_ebpf::sites::Phase;

    fn request() -> RequestRecord {
        let mut parts = [0u64; PARTS];
        parts[Part::LedgerFsync.index()] = 1000;
        parts[Part::Signing.index()] = 300;
        RequestRecord {
            req_id: 1,
            status: 200,
            t_arrive_ns: 0,
            t_done_ns: 2000,
            client_port: None,
            upstream_start_ns: None,
            parts,
            slices: vec![],
            samples: vec![
                StackSample {
                    ts_ns: 5,
                    tid: 1,
                    kernel_stack: -1,
                    user_stack: 7,
                    phase: Some(Phase::Auth),
                },
                StackSample {
                    ts_ns: 6,
                    tid: 1,
                    kernel_stack: -1,
                    user_stack: 7,
                    phase: Some(Phase::Auth),
                },
                StackSample {
                    ts_ns: 7,
                    tid: 1,
                    kernel_stack: -1,
                    user_stack: -1,
                    phase: None,
                },
            ],
            offcpu: vec![
                OffCpu {
                    tid: 2,
                    ns: 600,
                    kernel_stack: 8,
                    user_stack: -1,
                    part: Part::LedgerFsync,
                },
                OffCpu {
                    tid: 2,
                    ns: 300,
                    kernel_stack: -1,
                    user_stack: -1,
                    part: Part::Signing,
                },
                OffCpu {
                    tid: 1,
                    ns: 50,
                    kernel_stack: -1,
                    user_stack: -1,
                    part: Part::Scheduling,
                },
            ],
            waits: None,
            hits: Hits::default(),
        }
    }

    #[test]
    fn samples_fold_under_their_phase() {
        let stacks: HashMap<i64, Vec<u64>> = HashMap::from([(7, vec![0x1])]);
        let mut counts = StackCounts::default();
        counts.add_samples(&request());
        let folded = counts.fold(&stacks, &mut Symbolizer::new(ProcessMaps::default()));
        assert_eq!(folded.lines(), ["cpu.auth;[unknown] 2", "cpu;[no stack] 1"]);
    }

    #[test]
    fn ledger_towers_sum_to_the_parts_and_uncovered_time_is_synthetic() {
        let stacks: HashMap<i64, Vec<u64>> = HashMap::from([(8, vec![0x1, 0x2])]);
        let mut counts = StackCounts::default();
        counts.add_offcpu(&request());
        let folded = counts.fold(&stacks, &mut Symbolizer::new(ProcessMaps::default()));
        assert_eq!(folded.count_with_frame("ledger_fsync"), 1000);
        assert_eq!(folded.count_with_frame("signing"), 300);
        assert_eq!(
            folded.count_with_frame("fdatasync"),
            400,
            "1000 ns of fsync minus 600 with a stack"
        );
        assert_eq!(folded.count_with_frame("sign"), 300);
        assert_eq!(folded.count_with_frame(NO_STACK), 50);
        assert_eq!(folded.total(), 1350);
    }
}
