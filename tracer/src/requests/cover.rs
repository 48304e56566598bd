//! Building a request's slices: pieces are appended in time order, an override (the upstream
//! span) is painted on top, and the result is checked to cover `[t_arrive, t_done)` exactly
//! before parts are summed from it, so the parts sum to the total by construction.

use super::outcome::{OffCpu, PARTS, Part, Slice};

/// A piece of a request's cover. `off`: the switch-out that made this piece off-CPU
/// (tid, kernel stack, user stack), so it can be charged as an [`OffCpu`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    pub start: u64,
    pub end: u64,
    pub part: Part,
    pub tid: u32,
    pub off: Option<(u32, i64, i64)>,
}

impl Piece {
    pub(crate) fn new(start: u64, end: u64, part: Part, tid: u32) -> Self {
        Piece {
            start,
            end,
            part,
            tid,
            off: None,
        }
    }
}

#[derive(Default)]
pub(crate) struct Cover {
    pieces: Vec<Piece>,
}

pub(crate) struct Built {
    pub slices: Vec<Slice>,
    pub parts: [u64; PARTS],
    pub offcpu: Vec<OffCpu>,
}

impl Cover {
    pub(crate) fn push(&mut self, piece: Piece) {
        if piece.end > piece.start {
            self.pieces.push(piece);
        }
    }

    /// Paint `[start, end)` as `part` over whatever is there.
    pub(crate) fn overlay(&mut self, start: u64, end: u64, part: Part, tid: u32) {
        if end <= start {
            return;
        }
        let mut out = Vec::with_capacity(self.pieces.len() + 2);
        let mut placed = false;
        for p in self.pieces.drain(..) {
            if p.end <= start || p.start >= end {
                if p.start >= end && !placed {
                    out.push(Piece::new(start, end, part, tid));
                    placed = true;
                }
                out.push(p);
                continue;
            }
            if p.start < start {
                out.push(Piece { end: start, ..p });
            }
            if !placed {
                out.push(Piece::new(start, end, part, tid));
                placed = true;
            }
            if p.end > end {
                out.push(Piece { start: end, ..p });
            }
        }
        if !placed {
            out.push(Piece::new(start, end, part, tid));
        }
        self.pieces = out;
    }

    /// Paint `top` over the parts of `[top.start, top.end)` whose pieces `under` accepts,
    /// leaving every other piece as it is.
    pub(crate) fn overlay_where(&mut self, top: Piece, under: impl Fn(&Piece) -> bool) {
        if top.end <= top.start {
            return;
        }
        let mut out = Vec::with_capacity(self.pieces.len() + 2);
        for p in self.pieces.drain(..) {
            let (start, end) = (p.start.max(top.start), p.end.min(top.end));
            if start >= end || !under(&p) {
                out.push(p);
                continue;
            }
            if p.start < start {
                out.push(Piece { end: start, ..p });
            }
            out.push(Piece { start, end, ..top });
            if p.end > end {
                out.push(Piece { start: end, ..p });
            }
        }
        self.pieces = out;
    }

    /// Check the pieces cover `[from, to)` exactly, merge neighbours and sum the parts.
    pub(crate) fn build(self, from: u64, to: u64) -> Result<Built, &'static str> {
        let mut at = from;
        for p in &self.pieces {
            if p.start != at || p.end <= p.start {
                return Err("events out of order");
            }
            at = p.end;
        }
        if at != to {
            return Err("events out of order");
        }
        let mut parts = [0u64; PARTS];
        let mut slices: Vec<Slice> = Vec::with_capacity(self.pieces.len());
        let mut offcpu: Vec<OffCpu> = Vec::new();
        let mut last_off: Option<(Part, (u32, i64, i64))> = None;
        for p in &self.pieces {
            parts[p.part.index()] += p.end - p.start;
            match slices.last_mut() {
                Some(s) if s.part == p.part && s.tid == p.tid && s.end_ns == p.start => {
                    s.end_ns = p.end
                }
                _ => slices.push(Slice {
                    start_ns: p.start,
                    end_ns: p.end,
                    part: p.part,
                    tid: p.tid,
                }),
            }
            match p.off {
                Some(off) => {
                    let ns = p.end - p.start;
                    match offcpu.last_mut() {
                        Some(o) if last_off == Some((p.part, off)) => o.ns += ns,
                        _ => offcpu.push(OffCpu {
                            tid: off.0,
                            ns,
                            kernel_stack: off.1,
                            user_stack: off.2,
                            part: p.part,
                        }),
                    }
                    last_off = Some((p.part, off));
                }
                None => last_off = None,
            }
        }
        Ok(Built {
            slices,
            parts,
            offcpu,
        })
    }
}

#[cfg(test)]
mod tests {
    use tracer_ebpf::sites::Phase;

    use super::*;

    /// The built slices as `(start, end, part)`.
    fn spans(built: &Built) -> Vec<(u64, u64, Part)> {
        built
            .slices
            .iter()
            .map(|s| (s.start_ns, s.end_ns, s.part))
            .collect()
    }

    #[test]
    fn overlay_cuts_and_build_sums() {
        let mut t = Cover::default();
        t.push(Piece::new(0, 10, Part::Scheduling, 0));
        t.push(Piece::new(10, 30, Part::BlockedOther, 0));
        t.push(Piece::new(30, 40, Part::Scheduling, 0));
        t.overlay(15, 35, Part::Upstream, 0);
        let b = t.build(0, 40).unwrap();
        assert_eq!(
            spans(&b),
            vec![
                (0, 10, Part::Scheduling),
                (10, 15, Part::BlockedOther),
                (15, 35, Part::Upstream),
                (35, 40, Part::Scheduling),
            ]
        );
        assert_eq!(b.parts.iter().sum::<u64>(), 40);
    }

    #[test]
    fn overlay_where_paints_only_accepted_pieces() {
        let mut t = Cover::default();
        t.push(Piece::new(10, 20, Part::Cpu(Phase::ReceiptWait), 1));
        t.push(Piece::new(20, 30, Part::Scheduling, 1));
        t.push(Piece::new(30, 40, Part::Cpu(Phase::ReceiptWait), 1));
        t.overlay_where(Piece::new(15, 35, Part::Signing, 2), |p| {
            p.part == Part::Scheduling
        });
        let built = t.build(10, 40).unwrap();
        assert_eq!(
            spans(&built),
            [
                (10, 20, Part::Cpu(Phase::ReceiptWait)),
                (20, 30, Part::Signing),
                (30, 40, Part::Cpu(Phase::ReceiptWait)),
            ]
        );
        assert_eq!(built.parts.iter().sum::<u64>(), 30);
    }

    #[test]
    fn a_gap_is_refused() {
        let mut t = Cover::default();
        t.push(Piece::new(0, 10, Part::Scheduling, 0));
        t.push(Piece::new(11, 20, Part::Scheduling, 0));
        assert!(t.build(0, 20).is_err());
    }
}
