//! Who reads what: the live members split a scope's partitions round robin.

/// The partitions of `count` that are `member`'s share among `members`
/// (sorted, as [`LeaseStore::heartbeat`] returns them): round robin, so
/// shares differ by at most one partition.
///
/// [`LeaseStore::heartbeat`]: tidings_core::lease::LeaseStore::heartbeat
pub fn assignment(members: &[String], member: &str, count: u32) -> Vec<u32> {
    let Some(me) = members.iter().position(|m| m == member) else {
        return Vec::new();
    };
    let n = members.len() as u32;
    (0..count).filter(|p| p % n == me as u32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_partition_has_exactly_one_member() {
        let members: Vec<String> = ["m1", "m2", "m3"].iter().map(|s| s.to_string()).collect();
        let mut owners = vec![0; 16];
        for m in &members {
            for p in assignment(&members, m, 16) {
                owners[p as usize] += 1;
            }
        }
        assert!(owners.iter().all(|&n| n == 1), "{owners:?}");
        let shares: Vec<usize> = members
            .iter()
            .map(|m| assignment(&members, m, 16).len())
            .collect();
        assert_eq!(shares, vec![6, 5, 5]);
    }
}
