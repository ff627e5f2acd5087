use super::wire::*;

#[test]
fn requests_round_trip_and_malformed_ones_are_refused() {
    let mut request = Request::new(OP_MAKE, &[0x1000, 0x2000, 0o600]);
    request.name = b"solution".to_vec();
    assert_eq!(Request::decode(&request.encode()), Ok(request.clone()));
    let bytes = request.encode();
    assert!(Request::decode(&bytes[..HEADER_LEN - 1]).is_err());
    let mut bad = bytes.clone();
    bad[0] ^= 1;
    assert!(Request::decode(&bad).is_err(), "magic");
    let mut bad = bytes.clone();
    bad[6] = 99;
    assert!(Request::decode(&bad).is_err(), "unknown op");
    let mut get = Request::new(OP_GET, &[1, 2]).encode();
    get.push(b'x');
    assert!(Request::decode(&get).is_err(), "a name where none belongs");
    let mut long = Request::new(OP_LOOKUP, &[]);
    long.name = vec![b'a'; 64];
    assert!(Request::decode(&long.encode()).is_err(), "name too long");
    assert!(Request::decode(&Request::new(OP_LOOKUP, &[]).encode()).is_err(), "lookup without a name");
}

#[test]
fn owner_answers_are_checked_run_by_run() {
    let mut answer = Answer::ok(OP_FETCH, &[]);
    answer.runs =
        vec![Run { fd_index: 0, flags: RUN_REVOCABLE, offset: 0, length: 8192 }, Run { fd_index: HOLE, flags: 0, offset: 0, length: 4096 }];
    assert_eq!(Answer::decode(&answer.encode(), 1), Ok(answer.clone()));
    assert!(Answer::decode(&answer.encode(), 0).is_err(), "fd index beyond the descriptors sent");
    for (field, value) in [(0usize, 1u64), (1, 1 << 40), (2, 100), (3, 0)] {
        let mut bad = answer.clone();
        match field {
            0 => bad.runs[0].flags = value as u32 | 4,
            1 => bad.runs[0].offset = u64::MAX - 4095,
            2 => bad.runs[0].length = value,
            _ => bad.runs[0].length = value,
        }
        assert!(Answer::decode(&bad.encode(), 1).is_err(), "field {field}");
    }
    let mut truncated = answer.encode();
    truncated.pop();
    assert!(Answer::decode(&truncated, 1).is_err());
}

#[test]
fn a_failure_carries_its_errno_and_its_reasons_code() {
    let answer = Answer::failure(OP_ATTACH, xemem::Error::WholePagesOnly);
    let bytes = answer.encode();
    assert_eq!(i32::from_le_bytes(bytes[8..12].try_into().unwrap()), libc::EINVAL, "the errno stays XPMEM's");
    assert_eq!(u64::from_le_bytes(bytes[16..24].try_into().unwrap()), 8, "r0: the reason, apart from other EINVALs");
    assert_eq!(Answer::decode(&bytes, 0), Ok(answer));
    assert_eq!(Answer::failure(OP_ATTACH, xemem::Error::Invalid).results[0], 1);
}
