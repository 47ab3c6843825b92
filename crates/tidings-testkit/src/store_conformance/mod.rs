//! The store conformance suite: the checks every SQL dialect's store must
//! pass, written once over [`TestDb`](crate::services::TestDb).
//!
//! A dialect crate proves its store by expanding
//! [`store_conformance!`](crate::store_conformance) once in its tests,
//! naming its test database type:
//!
//! ```ignore
//! tidings_testkit::store_conformance!(tidings_testkit::services::PgTestDb);
//! ```
//!
//! Each check runs on a fresh, migrated database of its own, against the
//! real service, with the store's own relay, database log and the consumer
//! runtime on top. By concern:
//!
//! - [`outbox`]: the outbox and one relay, the database log;
//! - [`poison`]: records the relay cannot send, set aside with their keys;
//! - [`relays`]: several relays sharing the outbox's partitions;
//! - [`consumer`]: the consumer runtime: order, duplicates, effects,
//!   timeouts, batches;
//! - [`dead_letters`]: dead letters, redrive, parking, skipping;
//! - [`errors`]: which database errors are worth trying again;
//! - [`members`]: leases and several members of one group;
//! - [`replay`]: replays from the outbox;
//! - [`versions`]: upcasting and dual publishing;
//! - [`audit`]: the audit trail;
//! - [`trace`]: a message's story, by id and by key;
//! - [`redrive`]: one dead letter by id, redriven once, redriven edited.
//!
//! What the checks share (a test event, a recording handler, helpers over
//! any store) is in [`fixtures`].

pub mod audit;
pub mod consumer;
pub mod dead_letters;
pub mod errors;
pub mod fixtures;
pub mod members;
pub mod outbox;
pub mod poison;
pub mod redrive;
pub mod relays;
pub mod replay;
pub mod trace;
pub mod versions;

/// Expands the store conformance suite into one `#[tokio::test]` per
/// check, each on a fresh database of the test database type `$db` (a
/// [`TestDb`](crate::services::TestDb)), torn down after a passing check.
///
/// The tests are named `store_conformance::<concern>::<check>`, so that
/// `cargo test store_conformance::dead_letters` runs one concern.
#[macro_export]
macro_rules! store_conformance {
    ($db:ty) => {
        $crate::store_conformance!(@cases $db;
            outbox: [
                outbox_is_atomic_with_the_business_transaction,
                an_event_past_the_size_limit_is_refused_inside_the_transaction,
                relay_retries_until_the_transport_confirms,
                retention_keeps_sent_rows_until_cleanup,
                shutdown_finishes_the_batch_being_published,
                log_readers_never_skip_late_commits,
                log_retention_keeps_what_a_group_has_not_read,
            ],
            poison: [
                records_that_cannot_go_out_wait_alone_with_their_keys,
                with_a_retention_records_that_cannot_go_out_wait_alone,
                a_transport_refusing_everything_sets_nothing_aside,
                a_refused_record_with_only_its_key_behind_it_is_set_aside,
                a_search_longer_than_the_lease_settles_once,
            ],
            relays: [
                relays_share_the_partitions_and_keep_each_key_in_order,
                a_relay_whose_lease_was_taken_publishes_nothing,
                a_relay_stalled_mid_batch_marks_nothing_it_no_longer_holds,
                one_relay_keeps_several_partitions_in_flight_and_each_key_in_order,
                a_pipelined_relay_frozen_past_its_leases_keeps_each_key_in_order,
                a_refusal_that_fails_every_lane_blames_only_its_record,
            ],
            consumer: [
                per_key_order_holds_with_parallel_lanes,
                redelivered_duplicates_change_nothing,
                crashed_handlings_are_counted_until_one_ends,
                markers_past_the_dedupe_retention_are_forgotten_in_steps,
                effects_ledger_reuses_one_key_and_skips_recorded_effects,
                a_handler_past_its_timeout_is_rolled_back_and_retried,
                batches_handle_each_message_once_in_key_order,
                a_failing_batch_falls_back_to_one_message_at_a_time,
                a_lane_stuck_in_the_transport_does_not_hold_its_session,
                a_stop_during_a_retry_gives_back_the_rest_of_its_key,
            ],
            dead_letters: [
                poison_is_dead_lettered_without_blocking_other_keys,
                a_panicking_handler_fails_its_attempt_and_the_lane_goes_on,
                bad_input_reaches_the_failure_store_with_a_clear_error,
                a_redriven_dead_letter_is_handled_once,
                a_dead_letter_holds_its_key_until_redriven,
                a_skipped_dead_letter_lets_its_key_go_on,
                a_consumer_may_continue_past_a_dead_letter,
                a_member_past_its_lease_holds_no_key,
            ],
            errors: [
                a_lost_race_is_transient_and_bad_data_permanent,
            ],
            members: [
                leases_go_to_one_member_and_fences_grow,
                members_split_the_partitions_and_keep_each_key_in_order,
            ],
            replay: [
                a_replay_suppresses_what_was_processed_and_handles_what_was_lost,
            ],
            versions: [
                an_older_version_is_upcast_and_an_unreadable_one_dead_lettered,
                dual_publishing_feeds_each_version_once,
            ],
            audit: [
                audit_entries_are_kept_newest_first_and_found_by_target,
            ],
            trace: [
                a_message_is_traced_by_id_and_by_key,
            ],
            redrive: [
                a_settled_dead_letter_is_redriven_once,
                an_edited_redrive_sends_the_edit_and_keeps_the_original,
            ],
        );
    };
    (@cases $db:ty; $($concern:ident: [$($case:ident),* $(,)?]),* $(,)?) => {
        mod store_conformance {
            #[allow(unused_imports)]
            use super::*;
            $(
                mod $concern {
                    #[allow(unused_imports)]
                    use super::*;
                    $(
                        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                        async fn $case() {
                            let db = <$db as $crate::services::TestDb>::create().await;
                            $crate::store_conformance::$concern::$case(&db).await;
                            $crate::services::TestDb::teardown(&db).await;
                        }
                    )*
                }
            )*
        }
    };
}
