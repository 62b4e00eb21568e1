//! T3: a burst of lvol creations larger than the blobstore's metadata channel (512 request
//! sets) all succeed. Each creation takes a request set until its metadata is written; sent
//! all at once, the ones past 512 used to fail with ENOMEM (told as "no space" with the pool
//! nearly empty). `lvol::MAX_METADATA_CHANGES` holds the rest back until a slot is free.
#![cfg(feature = "spdk")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use liteio_agent::engine::PoolEngine;
use liteio_agent::engine::spdk::{BaseBdev, SpdkLvsEngine};
use liteio_agent::spdk::lvol::{self, Clear};

mod common;

const MIB: u64 = 1 << 20;
/// Well past the 512 request sets of an lvstore's metadata channel.
const BURST: usize = 1200;

#[test]
fn a_burst_of_creations_past_the_metadata_channel_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    // A sparse file: 4 GiB of 1 MiB clusters gives 4,096 metadata pages, room for every lvol.
    let engine = SpdkLvsEngine::new(
        "mdlvs",
        BaseBdev::Aio {
            name: "mdaio".into(),
            path: dir.path().join("lvs.img"),
            size: 4096 * MIB,
            create: true,
        },
        1 << 20,
    );
    common::with_spdk("t3-md-burst", false, Duration::from_secs(240), async move {
        tokio::task::spawn_blocking(move || engine.ensure_pool())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(lvol::free_metadata_slots(), lvol::MAX_METADATA_CHANGES);
        // Every creation sent at once, each on its own task.
        let tasks: Vec<_> = (0..BURST)
            .map(|i| {
                tokio::spawn(async move {
                    lvol::create_lvol("mdlvs", &format!("b{i}"), MIB, true, Clear::Unmap).await
                })
            })
            .collect();
        let mut failed = Vec::new();
        for (i, t) in tasks.into_iter().enumerate() {
            if let Err(e) = t.await.unwrap() {
                failed.push(format!("b{i}: {e}"));
            }
        }
        assert!(
            failed.is_empty(),
            "{} of {BURST} creations failed, first: {:?}",
            failed.len(),
            failed.first()
        );
        let names: std::collections::HashSet<String> = lvol::lvols()
            .await
            .unwrap()
            .into_iter()
            .filter(|l| l.lvs_name == "mdlvs")
            .map(|l| l.name)
            .collect();
        assert_eq!(names.len(), BURST, "every lvol is there, once");
        // The same burst of deletions.
        let tasks: Vec<_> = (0..BURST)
            .map(|i| {
                tokio::spawn(async move { lvol::delete_lvol("mdlvs", &format!("b{i}")).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert!(
            lvol::lvols()
                .await
                .unwrap()
                .iter()
                .all(|l| l.lvs_name != "mdlvs"),
            "every lvol is gone"
        );
        // Every slot was given back.
        assert_eq!(lvol::free_metadata_slots(), lvol::MAX_METADATA_CHANGES);
    });
}
