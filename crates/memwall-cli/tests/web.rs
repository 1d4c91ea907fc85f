//! `memwall web`: the page served on 127.0.0.1 with the right content types, and exported as the
//! files of web/. (The page itself is tested in a browser: tools/web_test/run.sh.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

const FILES: [&str; 7] = [
    "index.html",
    "app.js",
    "charts.js",
    "worker.js",
    "style.css",
    "pkg/memwall_wasm.js",
    "pkg/memwall_wasm_bg.wasm",
];

/// One request on a fresh connection; the whole response (the server closes it).
fn request(addr: &str, raw: &[u8]) -> (String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(raw).unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap();
    let split = all.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8(all[..split].to_vec()).unwrap();
    (head, all[split + 4..].to_vec())
}

fn get(addr: &str, path: &str) -> (String, Vec<u8>) {
    request(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
    )
}

#[test]
fn serves_the_page_on_localhost() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(["web", "--port", "0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"));
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let check = || {
        for (path, file, ctype) in [
            ("/", "index.html", "text/html; charset=utf-8"),
            ("/?x=1", "index.html", "text/html; charset=utf-8"),
            ("/app.js", "app.js", "text/javascript; charset=utf-8"),
            ("/style.css", "style.css", "text/css; charset=utf-8"),
            (
                "/pkg/memwall_wasm_bg.wasm",
                "pkg/memwall_wasm_bg.wasm",
                "application/wasm",
            ),
        ] {
            let (head, body) = get(&addr, path);
            assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{path}: {head}");
            assert!(
                head.contains(&format!("\r\nContent-Type: {ctype}\r\n")),
                "{head}"
            );
            assert_eq!(body, std::fs::read(repo().join("web").join(file)).unwrap());
        }
        for path in ["/nope", "/../Cargo.toml", "/web/index.html", "/pkg/"] {
            assert!(get(&addr, path).0.starts_with("HTTP/1.1 404 "), "{path}");
        }
        let (head, body) = request(&addr, b"HEAD / HTTP/1.1\r\n\r\n");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n") && body.is_empty());
        let post = request(&addr, b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n").0;
        assert!(post.starts_with("HTTP/1.1 405 "), "{post}");
        let big = format!("GET / HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(9000));
        assert!(request(&addr, big.as_bytes())
            .0
            .starts_with("HTTP/1.1 431 "));
        assert!(request(&addr, b"nonsense\r\n\r\n")
            .0
            .starts_with("HTTP/1.1 400 "));
    };
    let result = std::panic::catch_unwind(check);
    child.kill().unwrap();
    child.wait().unwrap();
    result.unwrap();
}

#[test]
fn exports_the_files_of_web() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("web-export");
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(["web", "--export"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("wrote the page's 7 files"));
    for f in FILES {
        assert_eq!(
            std::fs::read(dir.join(f)).unwrap(),
            std::fs::read(repo().join("web").join(f)).unwrap(),
            "{f}"
        );
    }
    // every file of web/ is in the page (a new file must be embedded to be served)
    let mut on_disk: Vec<String> = std::fs::read_dir(repo().join("web"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "pkg")
        .collect();
    on_disk.sort();
    let mut embedded: Vec<&str> = FILES.iter().filter(|f| !f.contains('/')).copied().collect();
    embedded.sort();
    assert_eq!(on_disk, embedded);
}

#[test]
fn port_and_export_are_one_or_the_other() {
    let out = Command::new(env!("CARGO_BIN_EXE_memwall"))
        .args(["web", "--port", "1", "--export", "x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be used with"));
}
