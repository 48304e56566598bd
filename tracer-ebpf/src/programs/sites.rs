//! Uprobes on the probe sites: one tiny program per [`Site`], so the site id is a constant and
//! no cookie or address lookup is needed.

use aya_ebpf::{macros::uprobe, programs::ProbeContext};
use tracer_ebpf::{abi::kind, sites::Site};

use super::maps::{current_target_tid, emit, now};

#[inline(always)]
fn site_hit(ctx: &ProbeContext, site: Site) -> u32 {
    // Attached with the target's pid as scope; the check also guards a reused pid.
    let Some(tid) = current_target_tid() else {
        return 0;
    };
    let ts = now();
    let arg = |n| ctx.arg::<u64>(n).unwrap_or(0);
    emit(ts, tid, kind::SITE, site as u16, [arg(0), arg(1), arg(2)]);
    0
}

macro_rules! site_program {
    ($name:ident, $site:expr) => {
        #[uprobe]
        pub fn $name(ctx: ProbeContext) -> u32 {
            site_hit(&ctx, $site)
        }
    };
}

site_program!(site_request_begin, Site::RequestBegin);
site_program!(site_request_end, Site::RequestEnd);
site_program!(site_phase, Site::Phase);
site_program!(site_poll_enter, Site::PollEnter);
site_program!(site_poll_exit, Site::PollExit);
site_program!(site_ledger_enqueue, Site::LedgerEnqueue);
site_program!(site_sign_begin, Site::SignBegin);
site_program!(site_sign_end, Site::SignEnd);
site_program!(site_receipt_durable, Site::ReceiptDurable);
