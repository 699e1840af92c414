//! What a work costs: the intervals its machine ran, recorded in its ledger record, priced
//! by the options' table. Money is kept in millionths of the currency unit (integers: the
//! component is no_std, and a ledger sum must not drift with float rounding).

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use serde::{Deserialize, Serialize};

use super::Work;

/// The size every plugin machine has: boxd's default (2 vCPU, 8 GiB). The plugin never
/// asks for another, so this is the row of the price table its machines bill at.
pub const MACHINE_SIZE: &str = "2x8";

const HOUR_MS: u128 = 3_600_000;

/// How stale a recorded use may be before boxd_job records a newer one: a write per poll
/// would buy at most this much more precision (a minute at 0.218/h is 0.004).
pub const ACTIVE_GRAIN_MS: u64 = 60_000;

/// One stretch of a machine running (or on standby, which bills the same memory):
/// opened by a create or wake, closed by a sleep, a drop, or a call that saw the machine
/// hibernated or gone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunInterval {
    pub from_ms: u64,
    #[serde(default)]
    pub to_ms: Option<u64>,
    pub size: String,
    /// What closed it: "boxd_sleep", "boxd_drop", "seen asleep", "seen gone".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_by: Option<String>,
    /// The last time a call found the machine running and used it (boxd_job's status
    /// exec): boxd's idle clock counts that traffic, so an interval seen ended runs at
    /// least an idle bound past it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_ms: Option<u64>,
    /// Fields this version does not know: kept through every write (see Work::unknown).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// What a dropped work cost, written once when the drop closes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Settled {
    pub closed_ms: u64,
    pub lifetime_ms: u64,
    pub running_ms: u64,
    /// Millionths of the price table's currency.
    pub cost_micros: u64,
    /// Fields this version does not know: kept through every write (see Work::unknown).
    #[serde(flatten)]
    pub unknown: BTreeMap<String, serde_json::Value>,
}

/// The price table (options `prices`), in millionths of a currency unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prices {
    /// Per machine size ("<vcpu>x<GiB>"), per hour running or on standby.
    pub running_per_hour: BTreeMap<String, u64>,
    /// Per GB of disk, per hour asleep (hibernated or stopped machines pay disk only).
    pub asleep_per_gb_hour: u64,
    /// The disk a machine is assumed to use (boxd bills used disk; the plugin cannot see it).
    pub stored_gb: u64,
}

impl Default for Prices {
    /// boxd's published rates (docs/configuration.md, "Spend"): €0.049 per vCPU-hour and
    /// €0.015 per GiB-hour running; €0.0001 per GiB-hour of used disk.
    fn default() -> Self {
        let rows = [("1x4", 109_000), ("2x8", 218_000), ("4x16", 436_000), ("8x32", 872_000)];
        Prices {
            running_per_hour: rows.iter().map(|(s, p)| (s.to_string(), *p)).collect(),
            asleep_per_gb_hour: 100,
            stored_gb: 10,
        }
    }
}

impl Prices {
    /// The hourly price of a machine of `size` running; an unknown size bills as the
    /// dearest row, so a ceiling never under-counts.
    pub fn running_rate(&self, size: &str) -> u64 {
        self.running_per_hour.get(size).copied().unwrap_or_else(|| self.running_per_hour.values().copied().max().unwrap_or(0))
    }

    pub fn asleep_rate(&self) -> u64 {
        self.asleep_per_gb_hour.saturating_mul(self.stored_gb)
    }
}

/// Both factors are below 2^64, so the product fits u128; a result past u64 (only a
/// hand-made price or record gives one) stays at the largest amount rather than wrapping.
fn priced(rate_per_hour: u64, ms: u64) -> u64 {
    u64::try_from(rate_per_hour as u128 * ms as u128 / HOUR_MS).unwrap_or(u64::MAX)
}

impl RunInterval {
    /// Its length up to `now_ms` while open; a hand-edited one that ends before it began
    /// is empty (never a wrapped subtraction). An end after now was written by a clock that
    /// was ahead then (a sleep with the clock a year ahead charged that year for good once
    /// the clock was set right): it counts only up to now.
    fn ms(&self, now_ms: u64) -> u64 {
        self.to_ms.unwrap_or(now_ms).min(now_ms).saturating_sub(self.from_ms)
    }
}

/// Millionths as the currency amount hosts show (0.218, not 218000).
pub fn amount(micros: u64) -> f64 {
    micros as f64 / 1_000_000.0
}

/// A number from the options as millionths: finite and not negative.
pub fn micros(x: f64) -> Option<u64> {
    (x.is_finite() && x >= 0.0 && x < 1.0e12).then(|| (x * 1_000_000.0 + 0.5) as u64)
}

impl Work {
    pub fn running_since(&self) -> Option<u64> {
        self.runs.last().filter(|r| r.to_ms.is_none()).map(|r| r.from_ms)
    }

    /// The machine started running (create, wake, or a call found it running).
    pub fn open_run(&mut self, now_ms: u64) {
        if self.running_since().is_none() {
            self.runs.push(RunInterval { from_ms: now_ms, to_ms: None, size: MACHINE_SIZE.to_string(), ended_by: None, active_ms: None, unknown: BTreeMap::new() });
        }
    }

    /// A call found the machine running at `now_ms` and used it: the run is open (from
    /// now, when the ledger had it down: woken outside the plugin, its time before this
    /// call cannot be known) and its last use is now.
    pub fn in_use(&mut self, now_ms: u64) {
        self.open_run(now_ms);
        if let Some(r) = self.runs.last_mut() {
            r.active_ms = Some(r.active_ms.unwrap_or(0).max(now_ms));
        }
    }

    /// Whether `in_use` at `now_ms` would tell the record something worth a write: no run
    /// open, or its last use older than ACTIVE_GRAIN_MS.
    pub fn use_unrecorded(&self, now_ms: u64) -> bool {
        match self.runs.last().filter(|r| r.to_ms.is_none()) {
            None => true,
            Some(r) => now_ms.saturating_sub(r.active_ms.unwrap_or(r.from_ms)) >= ACTIVE_GRAIN_MS,
        }
    }

    /// The machine stopped running at `at_ms` (never before its interval began).
    pub fn close_run(&mut self, at_ms: u64, by: &str) {
        if let Some(r) = self.runs.last_mut().filter(|r| r.to_ms.is_none()) {
            r.to_ms = Some(at_ms.max(r.from_ms));
            r.ended_by = Some(by.to_string());
        }
    }

    /// A call saw the machine not running (hibernated by its idle bound, stopped, or
    /// gone) while the ledger had it running. boxd hibernates it an idle bound after its
    /// last network traffic, so the interval ends there: at the latest of its start, its
    /// newest prompt and its last recorded use (`in_use`: a run hours long that boxd_job
    /// watched), plus the bound — never after now.
    pub fn seen_not_running(&mut self, now_ms: u64, idle_ms: u64, gone: bool) {
        let Some(r) = self.runs.last().filter(|r| r.to_ms.is_none()) else { return };
        let from = r.from_ms;
        let prompt = self.prompts.iter().map(|p| p.at_ms).filter(|&t| t >= from).max().unwrap_or(from);
        let active = prompt.max(r.active_ms.unwrap_or(from)).max(from);
        self.close_run(now_ms.min(active.saturating_add(idle_ms)), if gone { "seen gone" } else { "seen asleep" });
    }

    /// How long the machine has run, up to `now_ms` for an interval still open.
    pub fn running_ms(&self, now_ms: u64) -> u64 {
        self.runs.iter().fold(0, |sum, r| sum.saturating_add(r.ms(now_ms)))
    }

    /// From its create to its drop (or to now, while it lives); 0 for records older than
    /// the spend ledger.
    pub fn lifetime_ms(&self, now_ms: u64) -> u64 {
        if self.created_ms == 0 {
            return 0;
        }
        let end = self.settled.as_ref().map_or(now_ms, |s| s.closed_ms);
        end.saturating_sub(self.created_ms)
    }

    /// What the work has cost so far: every running interval at its size's rate, and the
    /// rest of its life asleep at the disk rate.
    pub fn spend_micros(&self, prices: &Prices, now_ms: u64) -> u64 {
        if let Some(s) = &self.settled {
            return s.cost_micros;
        }
        let running = self.runs.iter().fold(0u64, |sum, r| sum.saturating_add(priced(prices.running_rate(&r.size), r.ms(now_ms))));
        let asleep_ms = self.lifetime_ms(now_ms).saturating_sub(self.running_ms(now_ms));
        running.saturating_add(priced(prices.asleep_rate(), asleep_ms))
    }

    /// What the work costs per hour now: its size's rate while running, the disk rate
    /// while asleep, nothing once closed.
    pub fn burn_micros(&self, prices: &Prices) -> u64 {
        match self.runs.last().filter(|r| r.to_ms.is_none()) {
            Some(r) => prices.running_rate(&r.size),
            None if self.is_closed() || self.created_ms == 0 => 0,
            None => prices.asleep_rate(),
        }
    }

    /// Close the books at drop: the open interval ends now and the cost is fixed.
    pub fn settle(&mut self, prices: &Prices, now_ms: u64) {
        self.close_run(now_ms, "boxd_drop");
        let cost = self.spend_micros(prices, now_ms);
        self.settled = Some(Settled { closed_ms: now_ms, lifetime_ms: self.lifetime_ms(now_ms), running_ms: self.running_ms(now_ms), cost_micros: cost, unknown: BTreeMap::new() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Prompt;

    const H: u64 = 3_600_000;

    /// A hand-computed timeline at the default prices (2x8 at 0.218/h running, 10 GB at
    /// 0.0001/GB-h asleep = 0.001/h):
    ///   t=0 created, running · t=2h slept · t=5h woken · t=6h a prompt · idle bound 30 min,
    ///   seen hibernated at t=9h (so it ran until 6.5h) · dropped at t=10h.
    ///   running 2h + 1.5h = 3.5h → 0.763; asleep 10h − 3.5h = 6.5h → 0.0065; total 0.7695.
    #[test]
    fn spend_follows_a_hand_computed_timeline() {
        let p = Prices::default();
        let mut w = Work::new("w1", "/p", "t");
        w.created_ms = 1_000;
        w.open_run(1_000);
        assert_eq!(w.burn_micros(&p), 218_000);
        w.close_run(1_000 + 2 * H, "boxd_sleep");
        assert_eq!(w.burn_micros(&p), 1_000, "asleep: the disk only");
        assert_eq!(w.spend_micros(&p, 1_000 + 2 * H), 436_000);
        w.open_run(1_000 + 5 * H);
        w.open_run(1_000 + 5 * H + 7); // already running: no second interval
        w.prompts.push(Prompt { id: "p1".into(), at_ms: 1_000 + 6 * H, ..Default::default() });
        w.seen_not_running(1_000 + 9 * H, H / 2, false);
        assert_eq!(w.runs[1].to_ms, Some(1_000 + 6 * H + H / 2));
        assert_eq!(w.running_ms(1_000 + 9 * H), 3 * H + H / 2);
        w.settle(&p, 1_000 + 10 * H);
        let s = w.settled.clone().unwrap();
        assert_eq!((s.lifetime_ms, s.running_ms, s.cost_micros), (10 * H, 3 * H + H / 2, 763_000 + 6_500));
        assert_eq!(amount(s.cost_micros), 0.7695);
        assert_eq!(w.spend_micros(&p, 1_000 + 99 * H), 769_500, "settled: the cost no longer grows");
    }

    /// A run closed by a clock a year ahead (then set right) counts only up to now: it
    /// charged the year, and a resume answered CEILING_REACHED, for good.
    #[test]
    fn a_run_closed_by_a_clock_far_ahead_counts_only_up_to_now() {
        let p = Prices::default();
        let mut w = Work::new("w1", "/p", "t");
        w.created_ms = 1_000;
        w.open_run(1_000);
        w.close_run(1_000 + 8760 * H, "boxd_sleep");
        assert_eq!(w.running_ms(1_000 + 2 * H), 2 * H);
        assert_eq!(w.spend_micros(&p, 1_000 + 2 * H), 436_000, "two hours at the running rate");
    }

    /// Its last recorded use ends a run seen hibernated an idle bound later, when that is
    /// after the newest prompt's bound: t=0 created and a prompt · used at 3h · seen at 9h,
    /// bound 30 min → ran until 3.5h (before: until the prompt's 0.5h). Never past the call
    /// that sees it, and a use or prompt before the interval began does not count.
    #[test]
    fn a_run_seen_ended_counts_to_its_last_use() {
        let mut w = Work::new("w1", "/p", "t");
        w.open_run(0);
        w.prompts.push(Prompt { id: "p1".into(), at_ms: 0, ..Default::default() });
        w.in_use(3 * H);
        w.seen_not_running(9 * H, H / 2, false);
        assert_eq!((w.runs[0].to_ms, w.running_ms(9 * H)), (Some(3 * H + H / 2), 3 * H + H / 2));
        w.open_run(10 * H);
        w.in_use(10 * H + 60_000);
        w.seen_not_running(10 * H + 20 * 60_000, H / 2, true);
        assert_eq!(w.runs[1].to_ms, Some(10 * H + 20 * 60_000), "never past the call that saw it");
        w.open_run(11 * H);
        w.seen_not_running(20 * H, H / 2, false);
        assert_eq!(w.runs[2].to_ms, Some(11 * H + H / 2), "the older use and prompt are another interval's");
    }

    /// A hand-edited interval that ends before it began is empty, and sums and prices past
    /// u64 stay at the largest amount (before: 1117052835574.64 spent, or a panic).
    #[test]
    fn an_inverted_interval_or_a_huge_price_never_wraps() {
        let p = Prices::default();
        let mut w = Work::new("w1", "/p", "t");
        w.created_ms = 1;
        w.runs.push(RunInterval { from_ms: 5 * H, to_ms: Some(H), size: MACHINE_SIZE.into(), ..Default::default() });
        w.runs.push(RunInterval { from_ms: 6 * H, to_ms: Some(7 * H), size: MACHINE_SIZE.into(), ..Default::default() });
        assert_eq!(w.running_ms(10 * H), H);
        assert_eq!(w.spend_micros(&p, 1 + 10 * H), 218_000 + 9_000);
        let dear = Prices { running_per_hour: [("2x8".to_string(), u64::MAX / 2)].into_iter().collect(), ..Prices::default() };
        w.runs.push(RunInterval { from_ms: 0, to_ms: Some(u64::MAX), size: MACHINE_SIZE.into(), ..Default::default() });
        assert_eq!(w.running_ms(10 * H), 11 * H, "an end past now counts up to now");
        assert_eq!(w.running_ms(u64::MAX), u64::MAX, "and a sum past u64 stays at the largest");
        assert_eq!(w.spend_micros(&dear, 10 * H), u64::MAX);
    }

    #[test]
    fn an_unknown_size_bills_as_the_dearest_and_money_parses_exactly() {
        let p = Prices::default();
        assert_eq!(p.running_rate("16x64"), 872_000);
        assert_eq!(micros(0.218), Some(218_000));
        assert_eq!(micros(0.0001), Some(100));
        assert_eq!((micros(-1.0), micros(f64::NAN)), (None, None));
    }
}
