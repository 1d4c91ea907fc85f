//! The model's decoder layers as repeated blocks, and the reduced models that stand for them.
//!
//! Layers repeat: Llama is one layer 126 times, Gemma 2 a (sliding, full) pair 13 times,
//! DeepSeek-V3 three dense layers then 58 MoE layers. The sequence is cut into blocks, each a
//! pattern of `period` layers repeated `count` times. A block repeated more than
//! [`REDUCE_ABOVE`] times is *reduced*: a replay runs only a few of its repeats, the first
//! [`EDGE`] and the last [`EDGE`] ones as themselves (the repeats next to another block or the
//! model's ends, which see different neighbours) and the ones in between (the *interior*),
//! whose segments of the timeline differ from repeat to repeat by a constant.

/// Repeats at each end of a reduced block that are replayed as themselves.
pub(crate) const EDGE: usize = 1;

/// Repeats of a reduced block in the base replay: the edges and one interior repeat (the
/// replays with one and two more repeats have two and three, whose steps are checked equal).
pub(crate) const BASE: usize = 2 * EDGE + 1;

/// A block is reduced when it repeats more often than this (the base replay and the two that
/// measure and check the slope replay `BASE`, `BASE + 1` and `BASE + 2` repeats).
pub(crate) const REDUCE_ABOVE: usize = BASE + 2;

/// Longest pattern searched for.
const MAX_PERIOD: usize = 8;

/// A run of the layer sequence: `period` layers repeated `count` times from layer `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
    /// First layer.
    pub start: usize,
    /// Layers in one repeat.
    pub period: usize,
    /// Repeats in the full model.
    pub count: usize,
    /// Whether replays run fewer repeats than the model has (else the block's layers, which
    /// need not be alike, are replayed as they are).
    pub reduced: bool,
}

/// Cuts layers `0..n` into blocks; `same(i, j)` says whether layers `i` and `j` are replayed
/// identically. At each layer the pattern (up to [`MAX_PERIOD`] layers) repeated over the
/// most layers is taken when it repeats often enough to be reduced, else the layer alone.
/// Linear in `n`: a uniform model is one comparison per layer.
pub(crate) fn blocks(n: usize, same: impl Fn(usize, usize) -> bool, out: &mut Vec<Block>) {
    out.clear();
    let mut i = 0;
    while i < n {
        let mut best: Option<Block> = None;
        for period in 1..=MAX_PERIOD {
            if i + period * (REDUCE_ABOVE + 1) > n {
                break;
            }
            // a shorter pattern that already covers this one's layers wins
            if best.is_some_and(|b| b.period * b.count >= n - i) {
                break;
            }
            let mut count = 1;
            'grow: while i + (count + 1) * period <= n {
                let base = i + count * period;
                for k in 0..period {
                    if !same(base + k, i + k) {
                        break 'grow;
                    }
                }
                count += 1;
            }
            let b = Block {
                start: i,
                period,
                count,
                reduced: true,
            };
            if count > REDUCE_ABOVE && best.is_none_or(|x| period * count > x.period * x.count) {
                best = Some(b);
            }
        }
        let b = best.unwrap_or(Block {
            start: i,
            period: 1,
            count: 1,
            reduced: false,
        });
        // single layers join the previous block of layers replayed as they are
        match out.last_mut() {
            Some(last) if !b.reduced && !last.reduced => last.count += 1,
            _ => out.push(b),
        }
        i += b.period * b.count;
    }
}

/// Where a replayed slot sits in its block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// A layer of an unreduced block: replayed as itself in every replay (index in block).
    Exact(u32),
    /// One of the first [`EDGE`] repeats of a reduced block (repeat index).
    Head(u32),
    /// One of the last [`EDGE`] repeats of a reduced block (repeats from the end).
    Tail(u32),
    /// An interior repeat of a reduced block.
    Interior,
}

/// A replayed slot: its block, its place there and its layer within the pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Block index.
    pub block: u32,
    /// Layer within the block's pattern (0 for unreduced blocks).
    pub pos: u32,
    /// Place in the block.
    pub place: Place,
}

/// A reduced model: which full-model layer each slot runs, how many full-model layers it
/// stands for in whole-model sums, and where it sits.
#[derive(Debug, Default)]
pub(crate) struct Reduction {
    /// Full-model layer of each slot.
    pub layers: Vec<usize>,
    /// Weight of each slot in whole-model sums (they add up to the model's layer count).
    pub weight: Vec<u128>,
    /// Place of each slot.
    pub slots: Vec<Slot>,
}

impl Reduction {
    /// Fills `self` with the replay that runs `repeats[b]` repeats of each reduced block `b`
    /// (unreduced blocks run whole).
    pub fn build(&mut self, blocks: &[Block], repeats: &[usize]) {
        self.layers.clear();
        self.weight.clear();
        self.slots.clear();
        for (b, (blk, &c)) in blocks.iter().zip(repeats).enumerate() {
            let block = u32::try_from(b).unwrap_or(u32::MAX);
            if !blk.reduced {
                for k in 0..blk.period * blk.count {
                    self.layers.push(blk.start + k);
                    self.weight.push(1);
                    self.slots.push(Slot {
                        block,
                        pos: 0,
                        place: Place::Exact(u32::try_from(k).unwrap_or(u32::MAX)),
                    });
                }
                continue;
            }
            for j in 0..c {
                // the tail repeats run the block's last layers (their place in the model)
                let (orig, place) = if j < EDGE {
                    (j, Place::Head(j as u32))
                } else if j >= c - EDGE {
                    let from_end = c - 1 - j;
                    (blk.count - 1 - from_end, Place::Tail(from_end as u32))
                } else {
                    (j, Place::Interior)
                };
                // the first interior repeat stands for every repeat not replayed
                let weight = if j == EDGE {
                    (blk.count - c + 1) as u128
                } else {
                    1
                };
                for pos in 0..blk.period {
                    self.layers.push(blk.start + orig * blk.period + pos);
                    self.weight.push(weight);
                    self.slots.push(Slot {
                        block,
                        pos: pos as u32,
                        place,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(seq: &[u8]) -> Vec<Block> {
        let mut out = Vec::new();
        blocks(seq.len(), |i, j| seq[i] == seq[j], &mut out);
        out
    }

    #[test]
    fn uniform_layers_are_one_block() {
        assert_eq!(
            cut(&[0; 126]),
            vec![Block {
                start: 0,
                period: 1,
                count: 126,
                reduced: true,
            }]
        );
    }

    #[test]
    fn alternating_layers_repeat_a_pair() {
        let seq: Vec<u8> = (0..26).map(|i| (i % 2) as u8).collect();
        assert_eq!(
            cut(&seq),
            vec![Block {
                start: 0,
                period: 2,
                count: 13,
                reduced: true,
            }]
        );
    }

    #[test]
    fn unlike_layers_are_never_reduced() {
        let seq: Vec<u8> = (0..40).collect();
        let b = cut(&seq);
        assert_eq!(b.len(), 1);
        assert!(!b[0].reduced && b[0].count == 40);
    }

    #[test]
    fn short_runs_stay_whole_and_long_ones_reduce() {
        let mut seq = vec![1u8; 3];
        seq.extend([2u8; 58]);
        let b = cut(&seq);
        assert_eq!(b.len(), 2);
        assert!(!b[0].reduced && b[0].count == 3);
        assert!(b[1].reduced && b[1].count == 58 && b[1].start == 3);
    }

    #[test]
    fn a_reduction_keeps_edges_and_weights_the_interior() {
        let blocks = [Block {
            start: 0,
            period: 1,
            count: 100,
            reduced: true,
        }];
        let mut r = Reduction::default();
        r.build(&blocks, &[BASE]);
        assert_eq!(r.layers, vec![0, 1, 99]);
        assert_eq!(r.weight.iter().sum::<u128>(), 100);
        assert_eq!(r.slots[2].place, Place::Tail(0));
    }
}
