//! Model test: arbitrary sequences of slot operations by three clients and
//! the sidecar, each applied to the real `SlotControl` and to a plain model
//! written from the transition table in docs/protocol.md. After every step
//! the outcomes and the state word must agree.
#![cfg(not(loom))]

use proptest::prelude::*;
use protocol::layout::SlotControl;
use protocol::slot::{state, AbandonOutcome, OwnerTag, ReclaimOutcome, SlotWord};

/// The three clients' tags: client 2 has client 0's registry index with a
/// later generation (a successor at the same index), so the model checks that
/// a tag, not an index, owns a slot.
const TAGS: [OwnerTag; 3] = [
    OwnerTag::new(0, 1),
    OwnerTag::new(1, 1),
    OwnerTag::new(0, 2),
];

#[derive(Debug, Clone)]
enum Op {
    Claim(u16),
    Submit(u16),
    Cancel(u16),
    Take,
    Publish,
    Release(u16),
    Abandon(u16),
    Reclaim(u16),
    /// The sidecar refuses the request it holds (owner not live).
    Refuse,
    /// Housekeeping frees the slot if it is ABANDONED and no serve thread
    /// holds it.
    FreeAbandoned,
    /// Replays a client's oldest ticket: must never move a newer generation.
    Stale(u16),
}

fn op() -> impl Strategy<Value = Op> {
    let client = 0u16..3;
    prop_oneof![
        client.clone().prop_map(Op::Claim),
        client.clone().prop_map(Op::Submit),
        client.clone().prop_map(Op::Cancel),
        Just(Op::Take),
        Just(Op::Publish),
        client.clone().prop_map(Op::Release),
        client.clone().prop_map(Op::Abandon),
        client.clone().prop_map(Op::Reclaim),
        Just(Op::Refuse),
        Just(Op::FreeAbandoned),
        client.prop_map(Op::Stale),
    ]
}

/// The plain model: the word as three fields, moved by the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Model {
    generation: u64,
    owner: OwnerTag,
    state: u8,
}

impl Model {
    fn word(self) -> SlotWord {
        SlotWord {
            generation: self.generation,
            owner: self.owner,
            state: self.state,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn the_slot_behaves_like_its_transition_table(ops in prop::collection::vec(op(), 1..80)) {
        let slot = SlotControl::new();
        let mut model = Model { generation: 0, owner: OwnerTag::default(), state: state::FREE };
        // Per client: the ticket of its current claim, and its first ever ticket.
        let mut tickets: [Option<SlotWord>; 3] = [None; 3];
        let mut first: [Option<SlotWord>; 3] = [None; 3];
        let mut serving: Option<SlotWord> = None;

        for op in ops {
            match op {
                Op::Claim(c) => {
                    let real = slot.try_claim(TAGS[c as usize]);
                    if model.state == state::FREE {
                        model = Model { generation: model.generation + 1, owner: TAGS[c as usize], state: state::CLAIMED };
                        prop_assert_eq!(real, Some(model.word()));
                        tickets[c as usize] = real;
                        first[c as usize].get_or_insert(model.word());
                    } else {
                        prop_assert_eq!(real, None);
                    }
                }
                Op::Submit(c) => {
                    let Some(ticket) = tickets[c as usize] else { continue };
                    if ticket.state != state::CLAIMED { continue; }
                    let real = slot.submit(ticket);
                    if model.word() == ticket {
                        model.state = state::SUBMITTED;
                        prop_assert_eq!(real, Ok(model.word()));
                        tickets[c as usize] = Some(model.word());
                    } else {
                        prop_assert!(real.is_err());
                    }
                }
                Op::Cancel(c) => {
                    let Some(ticket) = tickets[c as usize] else { continue };
                    if ticket.state != state::CLAIMED { continue; }
                    let real = slot.cancel(ticket);
                    let expected = model.word() == ticket;
                    if expected { model.state = state::FREE; }
                    prop_assert_eq!(real, expected);
                }
                Op::Take => {
                    let real = slot.take();
                    match model.state {
                        state::SUBMITTED => {
                            model.state = state::SERVING;
                            prop_assert_eq!(real, Some(model.word()));
                            serving = real;
                        }
                        state::ABANDONED => {
                            model.state = state::FREE;
                            prop_assert_eq!(real, None);
                        }
                        _ => prop_assert_eq!(real, None),
                    }
                }
                Op::Publish => {
                    let Some(ticket) = serving.take() else { continue };
                    let real = slot.publish(ticket);
                    if model.word() == ticket {
                        model.state = state::PUBLISHED;
                        prop_assert_eq!(real, Ok(model.word()));
                        let c = TAGS.iter().position(|t| *t == model.owner).expect("a known tag");
                        tickets[c] = Some(model.word());
                    } else if model.generation == ticket.generation && model.state == state::ABANDONED {
                        model.state = state::FREE;
                        prop_assert_eq!(real, Err(model.word()));
                    } else {
                        prop_assert!(real.is_err());
                    }
                }
                Op::Release(c) => {
                    let Some(ticket) = tickets[c as usize] else { continue };
                    if ticket.state != state::PUBLISHED { continue; }
                    let real = slot.release(ticket);
                    let expected = model.word() == ticket;
                    if expected { model.state = state::FREE; }
                    prop_assert_eq!(real, expected);
                }
                Op::Abandon(c) => {
                    let Some(ticket) = tickets[c as usize] else { continue };
                    if ticket.state != state::SUBMITTED { continue; }
                    let real = slot.abandon(ticket);
                    let same_claim = model.generation == ticket.generation && model.owner == ticket.owner;
                    let expected = match model.state {
                        state::SUBMITTED | state::SERVING if same_claim => {
                            model.state = state::ABANDONED;
                            AbandonOutcome::Abandoned
                        }
                        state::PUBLISHED if same_claim => {
                            model.state = state::FREE;
                            AbandonOutcome::Released
                        }
                        _ => AbandonOutcome::Stale,
                    };
                    prop_assert_eq!(real, expected);
                }
                Op::Reclaim(c) => {
                    let real = slot.reclaim(TAGS[c as usize]);
                    let expected = if model.owner != TAGS[c as usize] {
                        ReclaimOutcome::NotOwned
                    } else {
                        match model.state {
                            state::CLAIMED | state::SUBMITTED | state::PUBLISHED => {
                                model.state = state::FREE;
                                ReclaimOutcome::Freed
                            }
                            state::SERVING => {
                                model.state = state::ABANDONED;
                                ReclaimOutcome::Abandoned
                            }
                            _ => ReclaimOutcome::NotOwned,
                        }
                    };
                    prop_assert_eq!(real, expected);
                }
                Op::Refuse => {
                    let Some(ticket) = serving else { continue };
                    let real = slot.refuse(ticket);
                    let expected = model.word() == ticket;
                    if expected {
                        model.state = state::FREE;
                        serving = None;
                    }
                    prop_assert_eq!(real, expected);
                }
                Op::FreeAbandoned => {
                    // Housekeeping's rule: only when no serve thread holds it.
                    if serving.is_some() { continue; }
                    let observed = slot.load();
                    if observed.state != state::ABANDONED { continue; }
                    prop_assert!(slot.free_abandoned(observed));
                    model.state = state::FREE;
                }
                Op::Stale(c) => {
                    let Some(old) = first[c as usize] else { continue };
                    if old.generation == model.generation { continue; }
                    let before = slot.load();
                    prop_assert!(slot.submit(old).is_err());
                    prop_assert!(!slot.cancel(old));
                    prop_assert_eq!(slot.load(), before, "a stale ticket moved the slot");
                }
            }
            prop_assert_eq!(slot.load(), model.word());
        }
    }
}
