//! The kernel counts every event it could not reserve in the ring (per CPU, with the time of
//! the latest). A rise between two polls becomes a loss span the rebuild must not guess over.

use aya::maps::{MapData, PerCpuArray};
use tracer_ebpf::abi::{LOSS_SLOT, Loss};

/// A loss counted just after a poll can carry a timestamp taken just before it (the program
/// reads the clock before it reserves); widen spans by this much to cover that.
const SLACK_NS: u64 = 1_000_000;

pub struct LossPoller {
    map: PerCpuArray<MapData, Loss>,
    counted: u64,
    last_poll_ns: u64,
}

/// Sum of the per-CPU records: total count and the latest loss time.
pub fn fold(per_cpu: impl IntoIterator<Item = Loss>) -> Loss {
    per_cpu.into_iter().fold(Loss::default(), |acc, loss| Loss {
        count: acc.count + loss.count,
        last_ts_ns: acc.last_ts_ns.max(loss.last_ts_ns),
    })
}

impl LossPoller {
    pub fn new(map: PerCpuArray<MapData, Loss>, now_ns: u64) -> Self {
        LossPoller {
            map,
            counted: 0,
            last_poll_ns: now_ns,
        }
    }

    /// Events lost so far.
    pub fn total(&self) -> u64 {
        self.counted
    }

    pub fn last_poll_ns(&self) -> u64 {
        self.last_poll_ns
    }

    /// Every loss not yet reported lies after this, so events before it are safe to hand on.
    pub fn settled_ns(&self) -> u64 {
        self.last_poll_ns.saturating_sub(SLACK_NS)
    }

    /// The span [from, to] in which the events lost since the previous poll happened, if any.
    pub fn poll(&mut self, now_ns: u64) -> anyhow::Result<Option<(u64, u64)>> {
        let values = self.map.get(&LOSS_SLOT, 0)?;
        let loss = fold(values.iter().copied());
        let from = self.settled_ns();
        self.last_poll_ns = now_ns;
        if loss.count == self.counted {
            return Ok(None);
        }
        self.counted = loss.count;
        Ok(Some(span(from, loss.last_ts_ns, now_ns)))
    }
}

/// The loss span from the settled point `from` to the kernel's latest loss time, widened by
/// [`SLACK_NS`] (within `now_ns`): `last_ts_ns` is a plain store, so a program nested in another
/// that lost an event at the same moment can have its later time overwritten by the outer's
/// earlier one, microseconds apart (the count itself is an atomic add and stays exact).
fn span(from: u64, last_ts_ns: u64, now_ns: u64) -> (u64, u64) {
    let to = last_ts_ns.saturating_add(SLACK_NS).min(now_ns);
    (from, to.max(last_ts_ns).max(from))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 21 item 11: the span covers a nested program's loss stamped just after the
    /// `last_ts_ns` that survived, but never runs past the poll.
    #[test]
    fn item11_loss_span_covers_a_nested_loss_time() {
        let (from, to) = span(1_000, 50_000_000, 200_000_000);
        assert_eq!(from, 1_000);
        assert!(to > 50_000_000, "a loss at 50 ms + 5 us is covered: {to}");
        assert_eq!(span(1_000, 50_000_000, 50_000_500).1, 50_000_500);
        assert_eq!(span(9_000, 5_000, 5_000), (9_000, 9_000));
    }

    #[test]
    fn folds_counts_and_latest_time() {
        let per_cpu = [
            Loss {
                count: 2,
                last_ts_ns: 50,
            },
            Loss {
                count: 3,
                last_ts_ns: 40,
            },
        ];
        assert_eq!(
            fold(per_cpu),
            Loss {
                count: 5,
                last_ts_ns: 50
            }
        );
    }
}
