//! Work queued per key, taken by whichever lane is free.
//!
//! A key's jobs run one at a time and in arrival order: a lane that takes a
//! key holds it until its jobs are done. Different keys run on any free
//! lane, so a slow key holds back only itself, never the keys that happen
//! to hash near it. The queue holds at most `capacity` jobs: the reader
//! waits for room beyond that, so memory stays bounded even when one key's
//! backlog grows.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;

use tokio::sync::Notify;

/// Jobs by key, for the lanes.
pub(super) struct KeyQueue<J> {
    state: Mutex<State<J>>,
    /// Signalled when a key becomes ready (one lane at a time: a lane that
    /// takes work and leaves more ready wakes the next) or the queue closes.
    work: Notify,
    /// Signalled when a job leaves the queue or the queue closes.
    room: Notify,
    capacity: usize,
}

struct State<J> {
    queues: HashMap<String, VecDeque<J>>,
    /// Keys with queued jobs that no lane holds, oldest first.
    ready: VecDeque<String>,
    /// Keys a lane holds.
    busy: HashSet<String>,
    queued: usize,
    closed: bool,
}

impl<J> KeyQueue<J> {
    pub(super) fn new(capacity: usize) -> Self {
        KeyQueue {
            state: Mutex::new(State {
                queues: HashMap::new(),
                ready: VecDeque::new(),
                busy: HashSet::new(),
                queued: 0,
                closed: false,
            }),
            work: Notify::new(),
            room: Notify::new(),
            capacity: capacity.max(1),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<J>> {
        self.state.lock().expect("key queue lock")
    }

    /// Waits until the queue has room for one more job (cancel-safe).
    pub(super) async fn room(&self) {
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = self.state();
                if state.queued < self.capacity || state.closed {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Queues `job` behind `key`'s earlier jobs.
    pub(super) fn put(&self, key: String, job: J) {
        let mut state = self.state();
        state.queued += 1;
        let queue = state.queues.entry(key.clone()).or_default();
        let was_empty = queue.is_empty();
        queue.push_back(job);
        if was_empty && !state.busy.contains(&key) {
            state.ready.push_back(key);
            drop(state);
            self.work.notify_one();
        }
    }

    /// Takes up to `max` jobs, from as many ready keys as needed (each
    /// key's jobs in order, its key held until [`KeyQueue::done`]); waits
    /// for work; `None` once the queue is closed and empty.
    pub(super) async fn take(&self, max: usize) -> Option<(Vec<String>, Vec<J>)> {
        loop {
            let notified = self.work.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = self.state();
                if !state.ready.is_empty() {
                    let (mut keys, mut jobs) = (Vec::new(), Vec::new());
                    while jobs.len() < max.max(1) {
                        let Some(key) = state.ready.pop_front() else { break };
                        let queue = state.queues.get_mut(&key).expect("a ready key has jobs");
                        while jobs.len() < max.max(1) {
                            match queue.pop_front() {
                                Some(job) => jobs.push(job),
                                None => break,
                            }
                        }
                        if queue.is_empty() {
                            state.queues.remove(&key);
                        }
                        state.busy.insert(key.clone());
                        keys.push(key);
                    }
                    state.queued -= jobs.len();
                    let more = !state.ready.is_empty();
                    let drained = state.closed && state.queued == 0;
                    drop(state);
                    if drained {
                        // Closed and empty: every waiting lane may end.
                        self.work.notify_waiters();
                    } else if more {
                        // One lane is woken per ready key: pass the wake-up on.
                        self.work.notify_one();
                    }
                    self.room.notify_waiters();
                    return Some((keys, jobs));
                }
                if state.closed && state.queued == 0 {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Releases the keys a lane took: those with more jobs queued meanwhile
    /// become ready again.
    pub(super) fn done(&self, keys: Vec<String>) {
        let mut state = self.state();
        let mut woke = false;
        for key in keys {
            state.busy.remove(&key);
            if state.queues.get(&key).is_some_and(|q| !q.is_empty()) {
                state.ready.push_back(key);
                woke = true;
            }
        }
        drop(state);
        if woke {
            self.work.notify_one();
        }
    }

    /// No more jobs: lanes finish what is queued, then [`KeyQueue::take`] returns `None`.
    pub(super) fn close(&self) {
        self.state().closed = true;
        self.work.notify_waiters();
        self.room.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_busy_key_waits_while_other_keys_go() {
        let q = KeyQueue::new(100);
        q.put("slow".into(), 1);
        q.put("slow".into(), 2);
        q.put("a".into(), 3);
        let (keys, jobs) = q.take(1).await.unwrap();
        assert_eq!((keys, jobs), (vec!["slow".to_owned()], vec![1]));
        // "slow" is held: the next lane gets "a", not slow's second job.
        let (keys, jobs) = q.take(1).await.unwrap();
        assert_eq!((keys.clone(), jobs), (vec!["a".to_owned()], vec![3]));
        q.done(keys);
        q.done(vec!["slow".into()]);
        let (keys, jobs) = q.take(1).await.unwrap();
        assert_eq!((keys, jobs), (vec!["slow".to_owned()], vec![2]));
    }

    #[tokio::test]
    async fn a_batch_spans_ready_keys_in_order() {
        let q = KeyQueue::new(100);
        for (k, j) in [("a", 1), ("b", 2), ("a", 3), ("c", 4)] {
            q.put(k.into(), j);
        }
        let (keys, jobs) = q.take(3).await.unwrap();
        assert_eq!(keys, vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(jobs, vec![1, 3, 2]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_lane_ends_once_the_closed_queue_is_drained() {
        let q = Arc::new(KeyQueue::new(100));
        q.put("a".into(), 1);
        q.put("a".into(), 2);
        let (keys, _) = q.take(1).await.unwrap();
        // Three idle lanes wait: "a" is held and its next job queued.
        let idle: Vec<_> = (0..3)
            .map(|_| {
                let q = q.clone();
                tokio::spawn(async move {
                    let mut taken = 0;
                    while let Some((keys, jobs)) = q.take(1).await {
                        taken += jobs.len();
                        q.done(keys);
                    }
                    taken
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        q.close();
        // The lanes wake, see a job queued behind the held key, and wait again.
        tokio::time::sleep(Duration::from_millis(50)).await;
        q.done(keys);
        let mut taken = 0;
        for lane in idle {
            taken += tokio::time::timeout(Duration::from_secs(5), lane)
                .await
                .expect("a lane hung after close")
                .unwrap();
        }
        assert_eq!(taken, 1, "the queued job ran once");
    }

    #[tokio::test]
    async fn room_waits_for_a_job_to_leave_and_close_ends_the_lanes() {
        let q = Arc::new(KeyQueue::new(1));
        q.put("a".into(), 1);
        let waiting = tokio::spawn({
            let q = q.clone();
            async move { q.room().await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "full: no room");
        let (keys, _) = q.take(1).await.unwrap();
        waiting.await.unwrap();
        q.done(keys);
        q.close();
        assert!(q.take(1).await.is_none());
    }
}
