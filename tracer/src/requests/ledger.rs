//! The ledger writer's intervals: fsync/fdatasync syscalls (any target thread) and
//! `[SignBegin, SignEnd]` on each writer thread, plus the probe hits of the batch in progress.
//!
//! Splitting a receipt wait `[a, b)` on writer `w`: time inside an fsync interval is
//! `LedgerFsync` (tid of the syscall), else time inside one of `w`'s sign intervals is
//! `Signing`, else `LedgerOther` (tid `w`). Fsync wins where both overlap (only possible across
//! threads).

use std::collections::{HashMap, VecDeque};

use super::outcome::{Hits, Part};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Interval {
    pub start: u64,
    pub end: u64,
    pub tid: u32,
}

/// A piece of a receipt wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LedgerPiece {
    pub start: u64,
    pub end: u64,
    pub part: Part,
    pub tid: u32,
}

#[derive(Default)]
pub(crate) struct WriterLog {
    /// In exit order, which is start order for one thread.
    syncs: VecDeque<Interval>,
    signs: VecDeque<Interval>,
    open_sign: HashMap<u32, u64>,
    /// Hits of each writer thread's current batch, shared by every request it makes durable.
    batch_hits: HashMap<u32, Hits>,
}

/// Intervals of `list` overlapping `[a, b)`, clipped; `list` is in end order.
pub(crate) fn overlapping(
    list: &VecDeque<Interval>,
    a: u64,
    b: u64,
    tid: Option<u32>,
) -> impl Iterator<Item = Interval> + '_ {
    let from = list.partition_point(|iv| iv.end <= a);
    list.range(from..)
        .filter(move |iv| iv.start < b && iv.end > a && tid.is_none_or(|t| t == iv.tid))
        .map(move |iv| Interval {
            start: iv.start.max(a),
            end: iv.end.min(b),
            tid: iv.tid,
        })
}

impl WriterLog {
    pub(crate) fn sync(&mut self, enter: u64, exit: u64, tid: u32) {
        self.syncs.push_back(Interval {
            start: enter,
            end: exit,
            tid,
        });
    }

    pub(crate) fn sign_begin(&mut self, ts: u64, tid: u32) {
        self.open_sign.insert(tid, ts);
    }

    pub(crate) fn sign_end(&mut self, ts: u64, tid: u32) {
        if let Some(start) = self.open_sign.remove(&tid) {
            self.signs.push_back(Interval {
                start,
                end: ts,
                tid,
            });
        }
    }

    pub(crate) fn batch_begin(&mut self, tid: u32) {
        self.batch_hits.insert(
            tid,
            Hits {
                sites: 1,
                ..Hits::default()
            },
        );
    }

    /// `tid` has sealed a batch: it is a ledger writer.
    pub(crate) fn is_writer(&self, tid: u32) -> bool {
        self.batch_hits.contains_key(&tid)
    }

    /// The current batch of `tid`, if `tid` is a writer inside one.
    pub(crate) fn batch_mut(&mut self, tid: u32) -> Option<&mut Hits> {
        self.batch_hits.get_mut(&tid)
    }

    /// The writer hits of `tid`'s batch not yet charged to a request, now charged: a batch's
    /// hits go to its first durable request only, so the mean per request is the true cost.
    pub(crate) fn take_batch(&mut self, tid: u32) -> Hits {
        self.batch_hits
            .get_mut(&tid)
            .map(std::mem::take)
            .unwrap_or_default()
    }

    pub(crate) fn split(&self, w: u32, a: u64, b: u64) -> Vec<LedgerPiece> {
        let mut marks: Vec<(u64, u64, Part, u32)> = Vec::new();
        for iv in overlapping(&self.syncs, a, b, None) {
            marks.push((iv.start, iv.end, Part::LedgerFsync, iv.tid));
        }
        for iv in overlapping(&self.signs, a, b, Some(w)) {
            marks.push((iv.start, iv.end, Part::Signing, iv.tid));
        }
        // Paint LedgerOther, then signing, then fsync on top.
        let mut pieces = vec![LedgerPiece {
            start: a,
            end: b,
            part: Part::LedgerOther,
            tid: w,
        }];
        marks.sort_by_key(|m| (m.2 == Part::LedgerFsync, m.0, m.1, m.3));
        for (start, end, part, tid) in marks {
            pieces = paint(
                pieces,
                LedgerPiece {
                    start,
                    end,
                    part,
                    tid,
                },
            );
        }
        pieces
    }

    pub(crate) fn prune(&mut self, horizon: u64) {
        while self.syncs.front().is_some_and(|iv| iv.end < horizon) {
            self.syncs.pop_front();
        }
        while self.signs.front().is_some_and(|iv| iv.end < horizon) {
            self.signs.pop_front();
        }
    }
}

/// Replace whatever `pieces` (sorted, gap-free) hold under `top` with `top`.
fn paint(pieces: Vec<LedgerPiece>, top: LedgerPiece) -> Vec<LedgerPiece> {
    let mut out = Vec::with_capacity(pieces.len() + 2);
    let mut placed = false;
    for p in pieces {
        if p.end <= top.start || p.start >= top.end {
            if p.start >= top.end && !placed {
                out.push(top);
                placed = true;
            }
            out.push(p);
            continue;
        }
        if p.start < top.start {
            out.push(LedgerPiece {
                end: top.start,
                ..p
            });
        }
        if !placed {
            out.push(top);
            placed = true;
        }
        if p.end > top.end {
            out.push(LedgerPiece {
                start: top.end,
                ..p
            });
        }
    }
    if !placed {
        out.push(top);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer's split of the wait `[from, to)` as `(start, end, part)`.
    fn split(w: &WriterLog, writer: u32, from: u64, to: u64) -> Vec<(u64, u64, Part)> {
        w.split(writer, from, to)
            .iter()
            .map(|p| (p.start, p.end, p.part))
            .collect()
    }

    #[test]
    fn fsync_over_signing_over_other() {
        let mut w = WriterLog::default();
        w.sign_begin(110, 9);
        w.sign_end(120, 9);
        w.sign_begin(125, 8); // another writer: ignored
        w.sign_end(128, 8);
        w.sync(130, 160, 9);
        assert_eq!(
            split(&w, 9, 100, 170),
            vec![
                (100, 110, Part::LedgerOther),
                (110, 120, Part::Signing),
                (120, 130, Part::LedgerOther),
                (130, 160, Part::LedgerFsync),
                (160, 170, Part::LedgerOther),
            ]
        );
    }

    #[test]
    fn clipped_to_the_wait() {
        let mut w = WriterLog::default();
        w.sync(90, 140, 9);
        assert_eq!(split(&w, 9, 100, 120), vec![(100, 120, Part::LedgerFsync)]);
    }
}
