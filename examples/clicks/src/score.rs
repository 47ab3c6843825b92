//! The fraud model: a session's state after each of its clicks, in order,
//! and the features it gives. The scorer applies it click by click; the
//! summary applies it again to the stored clicks and compares.

use crate::messages::Click;

/// Two clicks closer than this are "fast" (a person rarely clicks that fast).
pub const FAST_MS: i64 = 250;

/// What the scorer remembers of a session, and the features it publishes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Session {
    /// Clicks scored.
    pub clicks: i64,
    /// Of which fast.
    pub fast: i64,
    /// Fast clicks in a row, now.
    pub streak: i64,
    /// The longest run of fast clicks.
    pub max_streak: i64,
    /// When the last click was.
    pub last_at_ms: i64,
}

impl Session {
    /// The state after `click`.
    pub fn apply(self, click: &Click) -> Session {
        let fast = self.clicks > 0 && click.at_ms.saturating_sub(self.last_at_ms) < FAST_MS;
        let streak = if fast { self.streak + 1 } else { 0 };
        Session {
            clicks: self.clicks + 1,
            fast: self.fast + i64::from(fast),
            streak,
            max_streak: self.max_streak.max(streak),
            last_at_ms: click.at_ms.max(self.last_at_ms),
        }
    }

    /// The fraud score, 0 to 1000: the share of fast clicks, weighted up
    /// by long runs of them (a bot clicks fast and steadily).
    pub fn score(&self) -> i64 {
        if self.clicks == 0 {
            return 0;
        }
        let share = self.fast * 1000 / self.clicks;
        (share + 50 * self.max_streak.min(10)).min(1000)
    }

    /// Whether the session is flagged as fraud.
    pub fn flagged(&self) -> bool {
        self.clicks >= 5 && self.score() >= 600
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn click(seq: i64, at_ms: i64) -> Click {
        Click {
            click_id: format!("c{seq}"),
            session_id: "s".into(),
            seq,
            page: "/".into(),
            at_ms,
        }
    }

    #[test]
    fn a_steady_fast_clicker_is_flagged_and_a_person_is_not() {
        let bot = (1..=20).fold(Session::default(), |s, i| s.apply(&click(i, i * 100)));
        assert_eq!((bot.clicks, bot.fast, bot.max_streak), (20, 19, 19));
        assert!(bot.flagged(), "{bot:?} scores {}", bot.score());
        let person = (1..=20).fold(Session::default(), |s, i| s.apply(&click(i, i * 2_000)));
        assert_eq!((person.fast, person.score()), (0, 0));
        assert!(!person.flagged());
    }
}
