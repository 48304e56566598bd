//! What `tracer record` does for validation, kept in one place so record.rs only forwards:
//! the optional raw event dump (`--raw-events`, for the cross-check), the loss spans (so a
//! validation can check no complete request crosses one), BPF run-time stats and the tracer's
//! own cost, and the model's kernel figures. All land in breakdown.json as extra sections.

use std::path::Path;

use anyhow::Result;
use serde_json::json;
use tracer_ebpf::abi::Event;

use super::cost::CostMeter;
use super::raw_dump::{Kind, RawDump};
use crate::events::data::Data;
use crate::report::SessionWriter;
use crate::requests::SessionRebuilder;

/// Loss spans kept for breakdown.json; more are counted, not listed.
const MAX_SPANS: usize = 10_000;

pub struct Hooks {
    raw: Option<RawDump>,
    raw_data: Option<RawDump>,
    spans: Vec<(u64, u64)>,
    spans_total: u64,
    cost: CostMeter,
}

impl Hooks {
    /// Call once every program is attached. `overwrite`: replace an earlier dump at
    /// `raw_events` or `raw_data`.
    pub fn start(
        raw_events: Option<&Path>,
        raw_data: Option<&Path>,
        overwrite: bool,
        program_ids: Vec<u32>,
        bpf_stats: bool,
    ) -> Result<Hooks> {
        let raw = raw_events
            .map(|path| RawDump::create(Kind::Events, path, overwrite))
            .transpose()?;
        let raw_data = raw_data
            .map(|path| RawDump::create(Kind::Data, path, overwrite))
            .transpose()?;
        Ok(Hooks {
            raw,
            raw_data,
            spans: Vec::new(),
            spans_total: 0,
            cost: CostMeter::start(program_ids, bpf_stats),
        })
    }

    pub fn push(&mut self, event: &Event) {
        if let Some(raw) = &mut self.raw {
            raw.event(event);
        }
    }

    pub fn data(&mut self, data: &Data) {
        if let Some(dump) = &mut self.raw_data {
            dump.data(data);
        }
    }

    pub fn lost(&mut self, from_ns: u64, to_ns: u64) {
        self.spans_total += 1;
        if self.spans.len() < MAX_SPANS {
            self.spans.push((from_ns, to_ns));
        }
    }

    /// Before detaching: the BPF counters are read while the programs are loaded.
    pub fn before_detach(&mut self) {
        self.cost.programs_done();
    }

    /// At the end, before `writer.finish`: adds `kernel`, `loss_spans` and `cost`.
    pub fn finish(
        &mut self,
        rebuilder: &SessionRebuilder,
        writer: &mut SessionWriter,
    ) -> Result<()> {
        let raw_events = self.raw.take().map(RawDump::finish).transpose()?;
        if let Some(dump) = self.raw_data.take() {
            let n = dump.finish()?;
            say!("tracer: --raw-data: {n} data records written");
        }
        if let Some(kernel) = rebuilder.kernel() {
            writer.add_section("kernel", kernel.to_json());
        }
        writer.add_section(
            "loss_spans",
            json!(self.spans.iter().map(|&(a, b)| [a, b]).collect::<Vec<_>>()),
        );
        writer.add_section(
            "cost",
            self.cost.finish(json!({
                "loss_spans_total": self.spans_total,
                "raw_events_written": raw_events,
            })),
        );
        Ok(())
    }
}
