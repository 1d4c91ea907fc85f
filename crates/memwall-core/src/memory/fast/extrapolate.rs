//! From the segments of a few reduced replays to the full model's candidates.
//!
//! A replay's segments ([`Segment`]) are summarised into *items*, each a candidate instant
//! with its live bytes and their breakdown: a segment outside the interior of a reduced
//! block is an item as it is; the interior repeats of a reduced block (one run of segments)
//! are checked to differ from repeat to repeat by a constant, and stand as two items per
//! segment of the repeat — its first and its last occurrence in time, since the largest of
//! values affine in the repeat index is at one of its ends (the first in time on ties).
//!
//! The items of replays that differ by one repeat of one block line up one to one; each
//! item's values are affine in the block's repeat count (checked on three counts: the second
//! difference is zero), so they extrapolate exactly to the full count.

use super::blocks::{Place, Slot};
use crate::memory::timeline::{Phase, SegKind, Segment};

/// Live bytes and their breakdown ([`crate::memory::Category::ALL`] order).
pub(crate) type Vals = [i128; 10];

/// What an item is, for lining items up across replays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key {
    /// 0: a segment, 1: first of an interior run, 2: last of an interior run.
    pub what: u8,
    /// The slot's place (`None` outside the layers).
    pub slot: Option<(u32, u32, Place)>,
    /// Segment kind.
    pub kind: SegKind,
    /// Phase.
    pub phase: Phase,
    /// A phase-boundary instant.
    pub instant: bool,
    /// Anything allocated.
    pub hit: bool,
}

/// One candidate instant.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Item {
    /// What it is.
    pub key: Key,
    /// Live bytes, then their breakdown.
    pub v: Vals,
}

fn vals(s: &Segment) -> Vals {
    let mut v = [0i128; 10];
    if s.hit {
        v[0] = s.max as i128;
        for (d, a) in v[1..].iter_mut().zip(s.at) {
            *d = a as i128;
        }
    }
    v
}

fn key(s: &Segment, slot: Option<Slot>, what: u8) -> Key {
    Key {
        what,
        slot: slot.map(|x| (x.block, x.pos, x.place)),
        kind: s.tag.kind,
        phase: s.phase,
        instant: s.instant,
        hit: s.hit,
    }
}

fn sub(a: &Vals, b: &Vals) -> Vals {
    let mut d = [0i128; 10];
    for i in 0..10 {
        d[i] = a[i] - b[i];
    }
    d
}

/// One segment of an interior repeat: its first and last occurrence, and the step between
/// occurrences (scratch of [`summarise`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Template {
    key: Key,
    first: Vals,
    last: Vals,
    step: Option<Vals>,
    count: u32,
}

/// Summarises a replay's segments into `out`; `slots` places each slot. `false` when an
/// interior run is not affine in the repeat (the caller falls back to the full replay).
pub(crate) fn summarise(
    segs: &[Segment],
    slots: &[Slot],
    out: &mut Vec<Item>,
    run: &mut Vec<Template>,
) -> bool {
    out.clear();
    let slot_of = |s: &Segment| s.tag.slot.and_then(|i| slots.get(i as usize).copied());
    let mut i = 0;
    while i < segs.len() {
        let slot = slot_of(&segs[i]);
        let Some(first_slot) = slot.filter(|s| s.place == Place::Interior) else {
            out.push(Item {
                key: key(&segs[i], slot, 0),
                v: vals(&segs[i]),
            });
            i += 1;
            continue;
        };
        // the run of interior segments of this block
        run.clear();
        while i < segs.len() {
            let s = &segs[i];
            let Some(sl) = slot_of(s) else { break };
            if sl.place != Place::Interior || sl.block != first_slot.block {
                break;
            }
            let k = key(s, Some(sl), 1);
            let v = vals(s);
            match run.iter_mut().find(|t| t.key == k) {
                None => run.push(Template {
                    key: k,
                    first: v,
                    last: v,
                    step: None,
                    count: 1,
                }),
                Some(t) => {
                    let d = sub(&v, &t.last);
                    match t.step {
                        None => t.step = Some(d),
                        Some(st) if st == d => {}
                        Some(_) => return false,
                    }
                    t.last = v;
                    t.count += 1;
                }
            }
            i += 1;
        }
        // every segment of the repeat occurs once per repeat
        let count = run.first().map_or(0, |t| t.count);
        if run.iter().any(|t| t.count != count) {
            return false;
        }
        // firsts in time order (= template order), then lasts in time order (the last
        // repeat holds every template once, in the same order)
        for t in run.iter() {
            out.push(Item {
                key: t.key,
                v: t.first,
            });
        }
        for t in run.iter() {
            out.push(Item {
                key: Key { what: 2, ..t.key },
                v: t.last,
            });
        }
    }
    true
}

/// Extrapolates `base` in place: `deltas[b] = (items at BASE + 1, items at BASE + 2)` of each
/// reduced block `b`, `steps[b]` how many repeats the full model has beyond `BASE`. `false`
/// when the items do not line up or are not affine (the caller falls back).
pub(crate) fn extrapolate(base: &mut [Item], plus: &[(&[Item], &[Item])], steps: &[i128]) -> bool {
    for &(one, two) in plus {
        if one.len() != base.len() || two.len() != base.len() {
            return false;
        }
        for ((b, o), t) in base.iter().zip(one).zip(two) {
            if b.key != o.key || b.key != t.key {
                return false;
            }
            let d1 = sub(&o.v, &b.v);
            if sub(&t.v, &o.v) != d1 {
                return false;
            }
        }
    }
    for (k, item) in base.iter_mut().enumerate() {
        let mut v = item.v;
        for (&(one, _), &n) in plus.iter().zip(steps) {
            let d1 = sub(&one[k].v, &item.v);
            for i in 0..10 {
                // a value that does not move needs no product (most breakdown lines)
                if d1[i] == 0 {
                    continue;
                }
                let Some(x) = d1[i].checked_mul(n).and_then(|x| v[i].checked_add(x)) else {
                    return false;
                };
                v[i] = x;
            }
        }
        if v.iter().any(|&x| x < 0) {
            return false;
        }
        item.v = v;
    }
    true
}

/// Extrapolates scalars the same way (`base` in place).
pub(crate) fn extrapolate_scalars(
    base: &mut [i128],
    plus: &[(&[i128], &[i128])],
    steps: &[i128],
) -> bool {
    for &(one, two) in plus {
        if one.len() != base.len() || two.len() != base.len() {
            return false;
        }
        for ((b, o), t) in base.iter().zip(one).zip(two) {
            if t - o != o - b {
                return false;
            }
        }
    }
    for (k, b) in base.iter_mut().enumerate() {
        let mut v = *b;
        for (&(one, _), &n) in plus.iter().zip(steps) {
            let Some(x) = (one[k] - *b).checked_mul(n).and_then(|x| v.checked_add(x)) else {
                return false;
            };
            v = x;
        }
        if v < 0 {
            return false;
        }
        *b = v;
    }
    true
}

/// What a timeline says once its candidates are known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peaks {
    /// The step's peak.
    pub peak: u128,
    /// Its breakdown.
    pub at: [u128; 9],
    /// Its phase.
    pub phase: Phase,
    /// Peak within each phase (`Phase as usize`).
    pub phase_peaks: [u128; 6],
}

/// The peak (the first highest item), its breakdown and phase, and each phase's peak.
pub(crate) fn peaks(items: &[Item]) -> Option<Peaks> {
    let mut best: Option<&Item> = None;
    let mut phase_peaks = [0u128; 6];
    for it in items {
        if !it.key.hit {
            continue;
        }
        let v = u128::try_from(it.v[0]).ok()?;
        let p = &mut phase_peaks[it.key.phase as usize];
        *p = (*p).max(v);
        if !it.key.instant && best.is_none_or(|b| it.v[0] > b.v[0]) {
            best = Some(it);
        }
    }
    let best = best?;
    let mut at = [0u128; 9];
    for (a, &v) in at.iter_mut().zip(&best.v[1..]) {
        *a = u128::try_from(v).ok()?;
    }
    Some(Peaks {
        peak: u128::try_from(best.v[0]).ok()?,
        at,
        phase: best.key.phase,
        phase_peaks,
    })
}
