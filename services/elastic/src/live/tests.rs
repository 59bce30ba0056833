use super::*;

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .expect("time")
        .with_timezone(&Utc)
}

/// Monday 11:00 in Berlin: weekday daytime, inference 80%, training 20%.
const DAY: &str = "2026-11-30T10:00:00Z";

fn training(n: usize, since: &str) -> ClassLoad {
    ClassLoad {
        held: n as f64,
        leaving: 0.0,
        pending: 0.0,
        oldest_pending_since: None,
        preemptible: (0..n)
            .map(|i| Victim {
                job_id: format!("train-{i}"),
                gpus: 1.0,
                priority: 0,
                // train-0 is the oldest.
                started_at: at(since) + Duration::minutes(i as i64),
            })
            .collect(),
    }
}

fn inference(held: f64, pending: f64, waiting_since: Option<&str>) -> ClassLoad {
    ClassLoad {
        held,
        leaving: 0.0,
        pending,
        oldest_pending_since: waiting_since.map(at),
        preemptible: Vec::new(),
    }
}

fn policy() -> ElasticPolicy {
    ElasticPolicy::builtin().expect("policy")
}

#[test]
fn a_class_under_its_share_takes_idle_gpus_first_then_the_youngest_borrowers() {
    let now = at(DAY);
    let classes = BTreeMap::from([
        ("training".to_owned(), {
            let mut t = training(8, "2026-11-30T02:00:00Z");
            t.pending = 1.0;
            t
        }),
        (
            "inference".to_owned(),
            inference(0.0, 6.0, Some("2026-11-30T09:59:59.990Z")),
        ),
    ]);
    let mut burst = BurstState::default();
    let p = plan(&policy(), now, 10.0, &classes, &BTreeMap::new(), &mut burst);
    assert_eq!(p.window, "weekday daytime: inference first");
    assert_eq!(p.entitlement["inference"], 8.0);
    // 6 wanted, 2 idle: 4 training jobs stop, the youngest first.
    let stopped: Vec<&str> = p.preempt.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(stopped, ["train-7", "train-6", "train-5", "train-4"]);
    assert!(
        p.preempt[0].1.contains("inference is entitled to 8.0 GPUs"),
        "{:?}",
        p.preempt
    );
    // Training, over its 2, places nothing new meanwhile; inference is not held back.
    assert!(
        p.held_back["training"].contains("inference is entitled"),
        "{:?}",
        p.held_back
    );
    assert!(!p.held_back.contains_key("inference"));
    assert!(!p.burst_active, "waited 10 ms, under the 50 ms target");
}

#[test]
fn nothing_stops_when_idle_gpus_cover_the_need_or_no_class_is_short() {
    let now = at(DAY);
    let classes = BTreeMap::from([
        ("training".to_owned(), training(4, "2026-11-30T02:00:00Z")),
        ("inference".to_owned(), inference(2.0, 3.0, None)),
    ]);
    let p = plan(
        &policy(),
        now,
        10.0,
        &classes,
        &BTreeMap::new(),
        &mut BurstState::default(),
    );
    assert!(p.preempt.is_empty(), "{:?}", p.preempt);
    // Without pending inference, training may borrow everything.
    let classes = BTreeMap::from([
        ("training".to_owned(), {
            let mut t = training(9, "2026-11-30T02:00:00Z");
            t.pending = 1.0;
            t
        }),
        ("inference".to_owned(), inference(1.0, 0.0, None)),
    ]);
    let p = plan(
        &policy(),
        now,
        10.0,
        &classes,
        &BTreeMap::new(),
        &mut BurstState::default(),
    );
    assert!(p.preempt.is_empty() && p.held_back.is_empty(), "{p:?}");
}

#[test]
fn jobs_already_stopping_count_as_room_on_its_way() {
    // The first pass stopped four training jobs; while they stop, nothing more is taken.
    let now = at(DAY);
    let classes = BTreeMap::from([
        (
            "training".to_owned(),
            ClassLoad {
                leaving: 4.0,
                ..training(4, "2026-11-30T02:00:00Z")
            },
        ),
        ("inference".to_owned(), inference(0.0, 6.0, None)),
    ]);
    let p = plan(
        &policy(),
        now,
        10.0,
        &classes,
        &BTreeMap::new(),
        &mut BurstState::default(),
    );
    assert!(p.preempt.is_empty(), "{:?}", p.preempt);
}

#[test]
fn no_class_is_taken_below_its_own_entitlement() {
    // At night training is entitled to 8 of 10; it holds 9 and inference wants 5.
    let night = at("2026-11-30T22:00:00Z");
    let classes = BTreeMap::from([
        ("training".to_owned(), training(9, "2026-11-30T20:00:00Z")),
        ("inference".to_owned(), inference(1.0, 5.0, None)),
    ]);
    let p = plan(
        &policy(),
        night,
        10.0,
        &classes,
        &BTreeMap::new(),
        &mut BurstState::default(),
    );
    // Inference's 2 less the 1 it holds: one training job, and only one.
    assert_eq!(p.preempt.len(), 1, "{:?}", p.preempt);
}

#[test]
fn a_burst_borrows_beyond_the_share_and_gives_it_back_after_the_cooldown() {
    let now = at(DAY);
    let mut burst = BurstState::default();
    let waiting = BTreeMap::from([
        ("training".to_owned(), training(2, "2026-11-30T02:00:00Z")),
        (
            "inference".to_owned(),
            inference(8.0, 1.0, Some("2026-11-30T09:59:59Z")),
        ),
    ]);
    let p = plan(&policy(), now, 10.0, &waiting, &BTreeMap::new(), &mut burst);
    assert!(p.burst_active);
    // 10% of the fleet more, out of training's 2.
    assert!(
        (p.entitlement["inference"] - 9.0).abs() < 1e-9,
        "{:?}",
        p.entitlement
    );
    assert!((p.entitlement["training"] - 1.0).abs() < 1e-9);
    assert_eq!(
        p.preempt.len(),
        1,
        "one training job makes room: {:?}",
        p.preempt
    );
    // The queue drains: the burst holds for the ten-minute cooldown, then ends.
    let calm = BTreeMap::from([
        ("training".to_owned(), training(1, "2026-11-30T02:00:00Z")),
        ("inference".to_owned(), inference(9.0, 0.0, None)),
    ]);
    for (minutes, active) in [(1, true), (9, true), (12, false)] {
        let later = now + Duration::minutes(minutes);
        let p = plan(&policy(), later, 10.0, &calm, &BTreeMap::new(), &mut burst);
        assert_eq!(p.burst_active, active, "after {minutes} min");
    }
}

#[test]
fn a_forecast_moves_capacity_before_the_window_changes() {
    // 19:30 in Berlin: at 20:00 training goes from 20% to 80%.
    let before = at("2026-11-30T18:30:00Z");
    let classes = BTreeMap::from([
        (
            "training".to_owned(),
            ClassLoad {
                pending: 6.0,
                ..training(2, "2026-11-30T12:00:00Z")
            },
        ),
        ("inference".to_owned(), inference(6.0, 0.0, None)),
    ]);
    let no_forecast = plan(
        &policy(),
        before,
        10.0,
        &classes,
        &BTreeMap::new(),
        &mut BurstState::default(),
    );
    assert_eq!(no_forecast.entitlement["training"], 2.0);
    let forecast = BTreeMap::from([("training".to_owned(), 6.0)]);
    let p = plan(
        &policy(),
        before,
        10.0,
        &classes,
        &forecast,
        &mut BurstState::default(),
    );
    assert_eq!(p.entitlement["training"], 6.0);
    // Inference holds 6 of its 8, so nothing is taken from it: training gets the two idle
    // GPUs, and no more, until the window changes.
    assert!(p.preempt.is_empty(), "{:?}", p.preempt);
    // A forecast never takes a class past the next window's share.
    let greedy = BTreeMap::from([("training".to_owned(), 50.0)]);
    let p = plan(
        &policy(),
        before,
        10.0,
        &classes,
        &greedy,
        &mut BurstState::default(),
    );
    assert_eq!(p.entitlement["training"], 8.0);
}

#[test]
fn demand_history_forecasts_the_daily_cycle_and_scores_itself() {
    let mut h = DemandHistory::default();
    let start = at("2026-11-20T00:00:00Z");
    let demand = |hour: i64| 4.0 + 3.0 * ((hour % 24) as f64 / 24.0 * std::f64::consts::TAU).sin();
    for hour in 0..24 * 4 {
        for minute in [0, 20, 40] {
            let t = start + Duration::hours(hour) + Duration::minutes(minute);
            h.record(t, &BTreeMap::from([("inference".to_owned(), demand(hour))]));
        }
    }
    // Score forecasts made hour by hour over a fifth day.
    for hour in 24 * 4..24 * 5 {
        let t = start + Duration::hours(hour);
        let f = h.forecast(t);
        let predicted = f["inference"];
        assert!(
            (predicted - demand(hour + 1)).abs() < 0.8,
            "hour {hour}: {predicted} vs {}",
            demand(hour + 1)
        );
        h.record(t, &BTreeMap::from([("inference".to_owned(), demand(hour))]));
    }
    let error = h.forecast_error(start + Duration::hours(24 * 5));
    assert!(error["inference"] < 0.15, "{error:?}");
}
