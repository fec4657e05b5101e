//! `sluice-baseline`, the bare server beside which sluice is measured, as the report starts it.

use std::process::Command;

/// The report removes the body file as soon as the baseline says it listens, so the file must
/// be read by then: with a missing file the baseline fails without ever saying it listens
/// (it used to say so first and fail after, so a report could lose the race).
#[test]
fn the_fixed_server_reads_its_body_before_it_says_it_listens() {
    let missing = std::env::temp_dir().join(format!("sluice-baseline-test-{}-missing.json", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-baseline"))
        .args(["--listen", "127.0.0.1:0", "fixed", "--body-file"])
        .arg(&missing)
        .output()
        .expect("sluice-baseline runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "a missing body file is an error");
    assert!(!stdout.contains("listening"), "said it listens before reading its body: {stdout}");
}

/// With the file there, it answers every request with those bytes.
#[test]
fn the_fixed_server_answers_its_body() {
    use std::io::{BufRead, BufReader, Read, Write};
    let file = std::env::temp_dir().join(format!("sluice-baseline-test-{}-body.json", std::process::id()));
    std::fs::write(&file, br#"{"jsonrpc":"2.0","id":1,"result":"0x1"}"#).expect("temp file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-baseline"))
        .args(["--listen", "127.0.0.1:0", "fixed", "--body-file"])
        .arg(&file)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sluice-baseline runs");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("a line");
    let _ = std::fs::remove_file(&file); // as the report does, at once
    let addr = line.trim().strip_prefix("baseline listening on http://").expect("the listening line").to_owned();
    let body = br#"{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber"}"#;
    let mut s = std::net::TcpStream::connect(&addr).expect("connects");
    write!(s, "POST / HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len()).unwrap();
    s.write_all(body).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).expect("an answer");
    let _ = child.kill();
    let _ = child.wait();
    assert!(answer.ends_with(r#"{"jsonrpc":"2.0","id":1,"result":"0x1"}"#), "{answer}");
}
