//! Keeps the first counterexample of each safety property the checker meets.
//!
//! stateright's breadth-first checker records a violated `always` property each time it
//! visits a violating state, so it keeps the last one it met before it stopped. The
//! worlds' properties read a log whose flags stay set, so every state after a violation
//! violates too, and the path kept ran on past it. [`First`] reports each property
//! violated only at the first state that violates it: with one checker thread, states
//! are visited in order of depth, so that path is a shortest one, and it ends at the
//! step that broke the property. (With more threads, it is the first some thread met.)

use std::sync::{Arc, Mutex};

use stateright::{Expectation, Model, Property};

/// A property's condition over [`First`].
type Condition<M> = fn(&First<M>, &<M as Model>::State) -> bool;

/// The most properties a model may have.
const MAX: usize = 12;

/// `M` with each `always` property reported at its first violation only.
#[derive(Clone)]
pub struct First<M: Model> {
    /// The model checked.
    pub inner: M,
    /// Its properties, in order.
    properties: Arc<Vec<Property<M>>>,
    /// The `always` properties a violation was reported for (by index).
    seen: Arc<Mutex<Vec<usize>>>,
}

impl<M: Model> First<M> {
    /// `inner`, with no violation reported yet.
    pub fn new(inner: M) -> Self {
        let properties = inner.properties();
        assert!(properties.len() <= MAX, "First supports {MAX} properties");
        Self {
            inner,
            properties: Arc::new(properties),
            seen: Arc::default(),
        }
    }

    /// Property `i` at `state`: an `always` one's violation counts only the first time.
    fn holds<const I: usize>(&self, state: &M::State) -> bool {
        let property = &self.properties[I];
        if (property.condition)(&self.inner, state) {
            return true;
        }
        if property.expectation != Expectation::Always {
            return false;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(&I) {
            return true;
        }
        seen.push(I);
        false
    }
}

impl<M: Model> Model for First<M>
where
    M::State: Clone,
{
    type State = M::State;
    type Action = M::Action;

    fn init_states(&self) -> Vec<Self::State> {
        self.inner.init_states()
    }

    fn actions(&self, state: &Self::State, actions: &mut Vec<Self::Action>) {
        self.inner.actions(state, actions);
    }

    fn next_state(&self, last: &Self::State, action: Self::Action) -> Option<Self::State> {
        self.inner.next_state(last, action)
    }

    fn within_boundary(&self, state: &Self::State) -> bool {
        self.inner.within_boundary(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let conditions: [Condition<M>; MAX] = [
            First::holds::<0>,
            First::holds::<1>,
            First::holds::<2>,
            First::holds::<3>,
            First::holds::<4>,
            First::holds::<5>,
            First::holds::<6>,
            First::holds::<7>,
            First::holds::<8>,
            First::holds::<9>,
            First::holds::<10>,
            First::holds::<11>,
        ];
        (self.properties.iter().zip(conditions))
            .map(|(p, condition)| Property {
                expectation: p.expectation.clone(),
                name: p.name,
                condition,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use stateright::{Checker, HasDiscoveries};

    use super::*;

    /// A counter that climbs by 1 or 2 up to 12: "below 3" breaks at 3 and stays broken,
    /// "below 100" holds.
    #[derive(Clone)]
    struct Climb;

    impl Model for Climb {
        type State = u8;
        type Action = u8;

        fn init_states(&self) -> Vec<u8> {
            vec![0]
        }

        fn actions(&self, state: &u8, actions: &mut Vec<u8>) {
            if *state < 12 {
                actions.extend([1, 2]);
            }
        }

        fn next_state(&self, state: &u8, step: u8) -> Option<u8> {
            Some(state + step)
        }

        fn properties(&self) -> Vec<Property<Self>> {
            vec![
                Property::always("below 3", |_, n: &u8| *n < 3),
                // One that holds keeps the search going past the first violation.
                Property::always("below 100", |_, n: &u8| *n < 100),
            ]
        }
    }

    fn counterexample<M>(model: M) -> Vec<u8>
    where
        M: Model<State = u8, Action = u8> + Send + Sync + 'static,
    {
        let checker = model.checker().threads(1).spawn_bfs().join();
        let path = checker.discovery("below 3").expect("violated");
        path.into_states()
    }

    #[test]
    fn the_counterexample_kept_is_a_shortest_and_ends_at_the_violation() {
        assert_eq!(counterexample(First::new(Climb)), [0, 1, 3]);
        // Without the wrapper the checker keeps the last violating state it visited.
        assert!(counterexample(Climb).len() > 3);
    }

    #[test]
    fn a_property_that_holds_is_not_reported() {
        let checker = First::new(Climb)
            .checker()
            .finish_when(HasDiscoveries::AnyFailures)
            .spawn_bfs()
            .join();
        assert_eq!(checker.discoveries().len(), 1, "only 'below 3' is violated");
        assert!(checker.discovery("below 3").is_some());
    }
}
