//! `memwall web`: the web page (web/ at the repository root), embedded in the binary, served on
//! 127.0.0.1 or exported as static files.
//!
//! The page runs this very CLI compiled to WebAssembly (crates/memwall-wasm, built by
//! tools/web/build.sh into web/pkg/, committed with a hash of its inputs that `cargo test`
//! checks), so every number on it is the CLI's. The server is the least HTTP/1.1 that a browser
//! needs: `GET`/`HEAD` of the embedded files, bounded request heads, a short read timeout, a
//! thread per connection up to a fixed count, `Connection: close`, and nothing read from disk.

use crate::args::WebArgs;
use crate::output::OutputError;
use anyhow::Result;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// One file of the page.
struct PageFile {
    /// Path under the page's root (`pkg/memwall_wasm.js`).
    path: &'static str,
    /// `Content-Type` it is served with.
    content_type: &'static str,
    /// The bytes.
    bytes: &'static [u8],
}

/// The page, as built into the binary.
const FILES: &[PageFile] = &[
    PageFile {
        path: "index.html",
        content_type: "text/html; charset=utf-8",
        bytes: include_bytes!("../../../web/index.html"),
    },
    PageFile {
        path: "app.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../../web/app.js"),
    },
    PageFile {
        path: "charts.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../../web/charts.js"),
    },
    PageFile {
        path: "worker.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../../web/worker.js"),
    },
    PageFile {
        path: "style.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../../../web/style.css"),
    },
    PageFile {
        path: "pkg/memwall_wasm.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../../web/pkg/memwall_wasm.js"),
    },
    PageFile {
        path: "pkg/memwall_wasm_bg.wasm",
        content_type: "application/wasm",
        bytes: include_bytes!("../../../web/pkg/memwall_wasm_bg.wasm"),
    },
];

/// Largest request head read (request line and headers); a browser's GET is well under 2 KiB.
const MAX_HEAD_BYTES: usize = 8 << 10;

/// Connections served at once; more wait in the listener's backlog.
const MAX_CONNECTIONS: usize = 32;

/// How long a connection may take to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Port of `memwall web` when `--port` is not given.
pub const DEFAULT_PORT: u16 = 8787;

/// Runs `memwall web`: serves the page until interrupted, or writes it to `--export DIR`.
pub fn run(a: WebArgs, out: &mut dyn Write) -> Result<()> {
    let WebArgs { port, export } = a;
    if let Some(dir) = export {
        return export_to(&dir, out);
    }
    let port = port.unwrap_or(DEFAULT_PORT);
    let listener =
        TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)).map_err(|e| {
            crate::error::UserError::new(
                format!("cannot listen on 127.0.0.1:{port}: {e}"),
                "pick another port with --port P (0 takes any free one), or stop what holds it",
            )
        })?;
    let addr = listener.local_addr()?;
    writeln!(
        out,
        "memwall web: serving the page on http://{addr}/ (only this machine can reach it; Ctrl-C stops)"
    )
    .and_then(|()| out.flush())
    .map_err(OutputError::Stdout)?;
    serve(&listener);
    Ok(())
}

/// Writes every file of the page under `dir`.
fn export_to(dir: &Path, out: &mut dyn Write) -> Result<()> {
    let dir_error = |source| OutputError::File {
        flag: "--export",
        what: "the page",
        path: dir.to_owned(),
        source,
    };
    std::fs::create_dir_all(dir.join("pkg")).map_err(dir_error)?;
    for f in FILES {
        let path = dir.join(f.path);
        crate::output::write_file("--export", "a file of the page", &path, f.bytes)?;
    }
    writeln!(
        out,
        "memwall web: wrote the page's {} files to {} (serve the folder with any static web server; .wasm as application/wasm)",
        FILES.len(),
        dir.display()
    )
    .map_err(OutputError::Stdout)?;
    Ok(())
}

/// Accepts connections forever, each on its own thread while fewer than
/// [`MAX_CONNECTIONS`] are open.
fn serve(listener: &TcpListener) {
    let open = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if open.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            // too many at once: refuse this one rather than queue without bound
            let mut stream = stream;
            let _ = respond(
                &mut stream,
                503,
                "text/plain; charset=utf-8",
                b"busy\n",
                false,
            );
            continue;
        }
        open.fetch_add(1, Ordering::AcqRel);
        let mine = Arc::clone(&open);
        let spawned = std::thread::Builder::new()
            .name("memwall-web".to_owned())
            .spawn(move || {
                let mut stream = stream;
                let _ = handle(&mut stream);
                mine.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            // the thread never ran: its slot is free again
            open.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Reads one request head from `stream` (at most [`MAX_HEAD_BYTES`]) and answers it.
fn handle(stream: &mut TcpStream) -> io::Result<()> {
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    stream.set_write_timeout(Some(READ_TIMEOUT))?;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
        if head.len() >= MAX_HEAD_BYTES {
            let body = b"request head too large\n";
            return respond(stream, 431, "text/plain; charset=utf-8", body, false);
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(()); // closed before a whole request
        }
        head.extend_from_slice(&buf[..n]);
    }
    let (status, content_type, body, send_body) = answer(&head);
    respond(stream, status, content_type, body, send_body)
}

/// The answer to a request head: status, content type, body, and whether to send the body
/// (not for `HEAD`).
fn answer(head: &[u8]) -> (u16, &'static str, &'static [u8], bool) {
    const TEXT: &str = "text/plain; charset=utf-8";
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return (400, TEXT, b"bad request\n", true);
    };
    if !version.starts_with("HTTP/1.") {
        return (505, TEXT, b"HTTP/1.x only\n", true);
    }
    let send_body = match method {
        "GET" => true,
        "HEAD" => false,
        _ => return (405, TEXT, b"only GET and HEAD\n", true),
    };
    match find(target) {
        Some(f) => (200, f.content_type, f.bytes, send_body),
        None => (404, TEXT, b"not found\n", send_body),
    }
}

/// The page file a request target names (`/` is `index.html`; the query is ignored).
fn find(target: &str) -> Option<&'static PageFile> {
    let path = target.split(['?', '#']).next().unwrap_or_default();
    let path = path.strip_prefix('/')?;
    let path = if path.is_empty() { "index.html" } else { path };
    FILES.iter().find(|f| f.path == path)
}

/// Writes a whole response and closes the connection.
fn respond(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
    send_body: bool,
) -> io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "HTTP Version Not Supported",
    };
    let allow = if status == 405 {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Cache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    if send_body {
        stream.write_all(body)?;
    }
    stream.flush()?;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_name_only_the_embedded_files() {
        assert_eq!(find("/").map(|f| f.path), Some("index.html"));
        assert_eq!(find("/?model=gpt2").map(|f| f.path), Some("index.html"));
        assert_eq!(
            find("/pkg/memwall_wasm_bg.wasm").map(|f| f.content_type),
            Some("application/wasm")
        );
        for bad in [
            "",
            "index.html",
            "/../Cargo.toml",
            "/pkg/",
            "/web/index.html",
            "//etc/passwd",
        ] {
            assert!(find(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn answers_by_method_and_form() {
        assert_eq!(answer(b"GET / HTTP/1.1\r\n\r\n").0, 200);
        let (status, _, _, body) = answer(b"HEAD /app.js HTTP/1.1\r\n\r\n");
        assert_eq!((status, body), (200, false));
        assert_eq!(answer(b"POST / HTTP/1.1\r\n\r\n").0, 405);
        assert_eq!(answer(b"GET /nope HTTP/1.1\r\n\r\n").0, 404);
        assert_eq!(answer(b"GET / HTTP/2\r\n\r\n").0, 505);
        assert_eq!(answer(b"garbage\r\n\r\n").0, 400);
        assert_eq!(answer(b"GET / HTTP/1.1 extra\r\n\r\n").0, 400);
    }
}
