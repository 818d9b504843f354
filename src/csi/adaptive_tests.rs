use std::time::Duration;

use super::*;

#[test]
fn starts_at_the_ceiling_and_never_goes_above_it() {
    let mut aimd = Aimd::new(8);
    assert_eq!(aimd.allowed(), 8);
    for _ in 0..100 {
        aimd.ended(aimd.generation(), CallOutcome::Succeeded);
    }
    assert_eq!(aimd.allowed(), 8);
}

#[test]
fn a_ceiling_of_zero_is_one() {
    let aimd = Aimd::new(0);
    assert_eq!(aimd.allowed(), 1);
}

#[test]
fn a_refusal_halves_the_limit_down_to_one() {
    let mut aimd = Aimd::new(100);
    let mut seen = Vec::new();
    for _ in 0..9 {
        aimd.ended(aimd.generation(), CallOutcome::Overloaded);
        seen.push(aimd.allowed());
    }
    assert_eq!(seen, [50, 25, 12, 6, 3, 1, 1, 1, 1]);
}

#[test]
fn refusals_of_calls_started_before_the_decrease_count_once() {
    let mut aimd = Aimd::new(100);
    let before = aimd.generation();
    // Twenty calls of the same burst are refused.
    for _ in 0..20 {
        aimd.ended(before, CallOutcome::Overloaded);
    }
    assert_eq!(aimd.allowed(), 50, "one decrease for one burst");
    // A call started after the decrease is refused too: the load is still
    // too high.
    aimd.ended(aimd.generation(), CallOutcome::Overloaded);
    assert_eq!(aimd.allowed(), 25);
}

#[test]
fn other_errors_leave_the_limit_alone() {
    let mut aimd = Aimd::new(10);
    aimd.ended(aimd.generation(), CallOutcome::Overloaded);
    let before = aimd.clone();
    aimd.ended(aimd.generation(), CallOutcome::Other);
    assert_eq!(aimd, before);
}

#[test]
fn successes_grow_the_limit_by_about_one_per_limit_of_calls() {
    let mut aimd = Aimd::new(100);
    for _ in 0..3 {
        aimd.ended(aimd.generation(), CallOutcome::Overloaded);
    }
    assert_eq!(aimd.allowed(), 12);
    // 12.5 → 13.5 takes about 13 successes.
    for _ in 0..13 {
        aimd.ended(aimd.generation(), CallOutcome::Succeeded);
    }
    assert_eq!(aimd.allowed(), 13);
    // Back to the ceiling eventually.
    for _ in 0..10_000 {
        aimd.ended(aimd.generation(), CallOutcome::Succeeded);
    }
    assert_eq!(aimd.allowed(), 100);
}

#[test]
fn the_outcome_of_a_result() {
    let err = |code| {
        Err::<(), _>(crate::csi::CsiError::new(
            "CreateVolume",
            tonic::Status::new(code, "x"),
        ))
    };
    assert_eq!(CallOutcome::of(&Ok::<(), _>(())), CallOutcome::Succeeded);
    assert_eq!(
        CallOutcome::of(&err(tonic::Code::ResourceExhausted)),
        CallOutcome::Overloaded
    );
    assert_eq!(
        CallOutcome::of(&err(tonic::Code::Aborted)),
        CallOutcome::Overloaded
    );
    for code in [
        tonic::Code::Internal,
        tonic::Code::Unavailable,
        tonic::Code::DeadlineExceeded,
        tonic::Code::InvalidArgument,
    ] {
        assert_eq!(CallOutcome::of(&err(code)), CallOutcome::Other, "{code:?}");
    }
}

#[tokio::test]
async fn permits_beyond_the_limit_wait_for_a_free_slot() {
    let limit = ConcurrencyLimit::new(2);
    let a = limit.acquire().await;
    let _b = limit.acquire().await;
    let waiting = tokio::spawn({
        let limit = Arc::clone(&limit);
        async move { limit.acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "a third call waits");
    a.finish(CallOutcome::Succeeded);
    let c = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the freed slot admits the waiter")
        .expect("task");
    assert_eq!(limit.in_flight(), 2);
    drop(c);
    assert_eq!(limit.in_flight(), 1);
}

#[tokio::test]
async fn a_refusal_admits_fewer_calls_until_successes_raise_the_limit() {
    let limit = ConcurrencyLimit::new(4);
    let permits: Vec<Permit> =
        futures_util::future::join_all((0..4).map(|_| limit.acquire())).await;
    for permit in permits {
        permit.finish(CallOutcome::Overloaded);
    }
    assert_eq!(limit.allowed(), 2, "one burst, one halving");
    let _a = limit.acquire().await;
    let _b = limit.acquire().await;
    let third = tokio::time::timeout(Duration::from_millis(50), limit.acquire()).await;
    assert!(third.is_err(), "a third call waits at a limit of 2");
    assert_eq!(limit.in_flight(), 2, "the dropped wait holds nothing");
}

#[tokio::test]
async fn a_dropped_call_gives_its_slot_back_without_feedback() {
    let limit = ConcurrencyLimit::new(3);
    let permit = limit.acquire().await;
    drop(permit);
    assert_eq!(limit.in_flight(), 0);
    assert_eq!(limit.allowed(), 3, "no feedback from a dropped call");
}
