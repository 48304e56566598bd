//! The wait-for picture of the tail (`tail-wait.svg`) and its tables: the tail requests'
//! `scheduling` ns by what ran on their CPU instead, and their receipt waits by what the
//! writer did. The charges come from `requests::wait`; here they get their frames.
//!
//! Frames, outermost first: the waiter's part (`scheduling`), then the holder (below), then
//! the holder's stack where a cpu-clock sample of it fell inside the charged time.
//! - `another request` (+ `cpu.<phase>` where phases are traced; `cpu.parse` / `cpu.respond`
//!   for hyper reading it before its handler began / writing its response after it ended,
//!   traced or not): a gateway thread working for another request;
//! - `ledger-writer;sign|fdatasync|other (insert, commit, batching)`: the writer on CPU;
//! - `gateway thread <comm> (tid N);outside a request's poll (hyper I/O, runtime)`: on CPU
//!   with no request to charge: tokio's own work, accept, connection handling;
//! - `other process;<comm> (pid N)`: a task outside the gateway (the first one to take the
//!   CPU from a gateway thread; one that ran after it without the gateway running between is
//!   not seen);
//! - `idle (the wait had another cause)`: nothing ran;
//! - `[cpu not seen]`: no switch on that CPU yet (the uncovered remainder).

use std::collections::{BTreeMap, HashMap};

use crate::requests::{Holder, Part, RequestRecord, WriterWork};
use crate::symbolize::{StackSource, Symbolizer};

use session::pictures as model;

use super::fold::Folded;
use super::trace_json::ThreadNames;

/// Frames of a holder, `;`-separated.
pub fn holder_frames(
    holder: Holder,
    threads: &ThreadNames,
    tasks: &HashMap<u32, String>,
) -> String {
    let clean = |s: &str| s.replace(';', ":");
    match holder {
        Holder::Request { phase: None } => "another request".to_owned(),
        Holder::Request { phase: Some(p) } => {
            format!("another request;{}", Part::Cpu(p).name())
        }
        Holder::Writer(WriterWork::Sign) => "ledger-writer;sign".to_owned(),
        Holder::Writer(WriterWork::Fsync) => "ledger-writer;fdatasync".to_owned(),
        Holder::Writer(WriterWork::Other) => {
            "ledger-writer;other (insert, commit, batching)".to_owned()
        }
        Holder::WriterBlocked => "ledger-writer;blocked outside fsync".to_owned(),
        Holder::Thread(tid) => format!(
            "gateway thread {} (tid {tid});outside a request's poll (hyper I/O, runtime)",
            clean(threads.get(&tid).map_or("?", String::as_str))
        ),
        Holder::Process(pid) => format!(
            "other process;{} (pid {pid})",
            clean(tasks.get(&pid).map_or("?", String::as_str))
        ),
        Holder::Idle => "idle (the wait had another cause)".to_owned(),
        Holder::Unknown => "[cpu not seen]".to_owned(),
    }
}

/// The tail's wait charges, before symbolization.
#[derive(Default)]
pub struct WaitCounts {
    /// (part, holder, kernel stack, user stack) → ns.
    counts: HashMap<(Part, Holder, i64, i64), u64>,
    /// The charged requests' summed `scheduling` and receipt-wait parts.
    scheduling_ns: u64,
    receipt_ns: u64,
    requests: u64,
    /// Requests added whose waits were not charged (see `wait::Selection`).
    uncharged: u64,
}

impl WaitCounts {
    /// Adds a request's charges; one with none charged is only counted.
    pub fn add(&mut self, req: &RequestRecord) {
        let Some(waits) = &req.waits else {
            self.uncharged += 1;
            return;
        };
        self.requests += 1;
        self.scheduling_ns += req.part_ns(Part::Scheduling);
        self.receipt_ns += [Part::LedgerFsync, Part::Signing, Part::LedgerOther]
            .iter()
            .map(|&p| req.part_ns(p))
            .sum::<u64>();
        for w in waits {
            *self
                .counts
                .entry((w.part, w.holder, w.kernel_stack, w.user_stack))
                .or_default() += w.ns;
        }
    }

    /// The `scheduling` charges as folded stacks.
    pub fn fold(
        &self,
        stacks: &dyn StackSource,
        symbolizer: &mut Symbolizer,
        threads: &ThreadNames,
        tasks: &HashMap<u32, String>,
    ) -> Folded {
        let mut folded = Folded::default();
        for (&(part, holder, kernel, user), &ns) in &self.counts {
            if part != Part::Scheduling {
                continue;
            }
            let mut line = format!("{};{}", part.name(), holder_frames(holder, threads, tasks));
            if (kernel >= 0 || user >= 0)
                && let Some(frames) = symbolizer.stack(stacks, kernel, user)
            {
                line.push(';');
                line.push_str(&frames);
            }
            folded.add(&line, ns);
        }
        folded
    }

    /// The tables as pictures.json writes them (`wait`, `wait_all`).
    pub fn summary(&self, threads: &ThreadNames, tasks: &HashMap<u32, String>) -> model::Wait {
        let label = |h: Holder| holder_frames(h, threads, tasks).replace(';', " · ");
        let mut holders: BTreeMap<String, u64> = BTreeMap::new();
        let mut receipt: BTreeMap<(String, String), u64> = BTreeMap::new();
        let mut summary = model::Wait {
            requests: Some(self.requests),
            uncharged_requests: Some(self.uncharged),
            scheduling_ns: self.scheduling_ns,
            receipt_ns: self.receipt_ns,
            ..model::Wait::default()
        };
        for (&(part, holder, _, _), &ns) in &self.counts {
            if part == Part::Scheduling {
                summary.charged_ns += ns;
                if holder == Holder::Unknown {
                    summary.unknown_ns += ns;
                }
                *holders.entry(label(holder)).or_default() += ns;
            } else {
                *receipt
                    .entry((part.name().to_owned(), label(holder)))
                    .or_default() += ns;
            }
        }
        summary.holders = (holders.into_iter())
            .map(|(holder, ns)| model::Holder { holder, ns })
            .collect();
        summary
            .holders
            .sort_by(|a, b| b.ns.cmp(&a.ns).then(a.holder.cmp(&b.holder)));
        summary.receipt = (receipt.into_iter())
            .map(|((part, holder), ns)| model::ReceiptHolder { holder, ns, part })
            .collect();
        summary.receipt.sort_by(|a, b| {
            (b.ns.cmp(&a.ns)).then((&a.part, &a.holder).cmp(&(&b.part, &b.holder)))
        });
        summary
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requests::synthetic::wait_charge;
    use crate::requests::{Hits, PARTS};
    use crate::symbolize::ProcessMaps;

    #[test]
    fn scheduling_is_folded_and_the_receipt_only_tabled() {
        let mut parts = [0u64; PARTS];
        parts[Part::Scheduling.index()] = 100;
        parts[Part::LedgerOther.index()] = 7;
        let req = RequestRecord {
            req_id: 1,
            status: 200,
            t_arrive_ns: 0,
            t_done_ns: 107,
            client_port: None,
            upstream_start_ns: None,
            parts,
            slices: vec![],
            samples: vec![],
            offcpu: vec![],
            waits: Some(vec![
                wait_charge(Part::Scheduling, Holder::Process(42), 60, -1),
                wait_charge(Part::Scheduling, Holder::Request { phase: None }, 30, 7),
                wait_charge(Part::Scheduling, Holder::Idle, 10, -1),
                wait_charge(Part::LedgerOther, Holder::Writer(WriterWork::Other), 7, -1),
            ]),
            hits: Hits::default(),
        };
        let mut counts = WaitCounts::default();
        counts.add(&req);
        let tasks = HashMap::from([(42, "hog".to_owned())]);
        let stacks: HashMap<i64, Vec<u64>> = HashMap::from([(7, vec![0x1])]);
        let folded = counts.fold(
            &stacks,
            &mut Symbolizer::new(ProcessMaps::default()),
            &ThreadNames::new(),
            &tasks,
        );
        assert_eq!(
            folded.lines(),
            [
                "scheduling;another request;[unknown] 30",
                "scheduling;idle (the wait had another cause) 10",
                "scheduling;other process;hog (pid 42) 60",
            ]
        );
        let summary = counts.summary(&ThreadNames::new(), &tasks);
        assert_eq!((summary.scheduling_ns, summary.charged_ns), (100, 100));
        assert_eq!(
            summary.holders[0],
            model::Holder {
                holder: "other process · hog (pid 42)".to_owned(),
                ns: 60
            }
        );
        assert_eq!(summary.receipt_ns, 7);
        assert_eq!(summary.receipt.len(), 1);
    }
}
