//! The set-up scripts: packages come through their clients' configured indexes, and the
//! repository names no registry's host (a machine behind a mirror or proxy must be able to run
//! the tests).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ggml_viz_e2e::{scratch, text};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The registries' hosts, spelt in pieces so that this file does not name them whole.
fn registry_hosts() -> Vec<String> {
    [
        ["pypi", ".org"],
        ["pythonhosted", ".org"],
        ["crates", ".io"],
        ["npmjs", ".org"],
        ["deb.debian", ".org"],
        ["security.debian", ".org"],
    ]
    .iter()
    .map(|parts| parts.concat())
    .collect()
}

#[test]
fn no_tracked_file_names_a_registry_host() {
    let root = repo_root();
    let listed = Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["ls-files", "-z"])
        .output()
        .unwrap();
    assert!(
        listed.status.success(),
        "git ls-files: {}",
        text(&listed.stderr)
    );
    let files: Vec<&str> = std::str::from_utf8(&listed.stdout)
        .unwrap()
        .split('\0')
        .filter(|f| !f.is_empty())
        .collect();
    assert!(
        files.iter().any(|f| f.ends_with("setup-whisper.sh")),
        "the listing misses the scripts"
    );
    let hosts = registry_hosts();
    let mut named = Vec::new();
    for file in files {
        // Cargo's lock files record the index cargo itself resolved against; cargo writes them.
        if file.ends_with("Cargo.lock") {
            continue;
        }
        let Ok(bytes) = std::fs::read(root.join(file)) else {
            continue; // deleted in the work tree
        };
        let content = String::from_utf8_lossy(&bytes).to_lowercase();
        named.extend(
            hosts
                .iter()
                .filter(|host| content.contains(host.as_str()))
                .map(|host| format!("{file}: {host}")),
        );
    }
    assert!(
        named.is_empty(),
        "registry hosts named in tracked files: {named:?}"
    );
}

/// A package index on loopback (a PEP 503 simple page and a file beside it), served by Python's
/// http.server from `root`; returns the server and its port.
fn serve(root: &Path) -> (std::process::Child, u16) {
    let mut server = Command::new("python3")
        .arg("-c")
        .arg(
            "import functools, http.server, sys\n\
             handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])\n\
             handler.func.log_message = lambda *a: None\n\
             s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)\n\
             print(s.server_address[1], flush=True)\n\
             s.serve_forever()\n",
        )
        .arg(root)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (server, line.trim().parse().unwrap())
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    text(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn an_sdist_is_fetched_through_the_index_pips_configuration_names() {
    let dir = scratch("fetch-sdist");
    let index = dir.join("index");
    std::fs::create_dir_all(index.join("simple/some-project")).unwrap();
    std::fs::create_dir_all(index.join("files/ab")).unwrap();
    let wanted = index.join("files/ab/some_project-1.5.1.tar.gz");
    std::fs::write(&wanted, b"the 1.5.1 sdist's bytes").unwrap();
    std::fs::write(
        index.join("files/ab/some_project-1.5.0.tar.gz"),
        b"an older sdist",
    )
    .unwrap();
    // Relative links with a fragment, as a PEP 503 page has them; the older version first.
    std::fs::write(
        index.join("simple/some-project/index.html"),
        "<html><body>\n<a href=\"../../files/ab/some_project-1.5.0.tar.gz#sha256=00\">some_project-1.5.0.tar.gz</a>\n\
         <a href=\"../../files/ab/some_project-1.5.1.tar.gz#sha256=11\">some_project-1.5.1.tar.gz</a>\n</body></html>\n",
    )
    .unwrap();
    let (mut server, port) = serve(&index);
    // The index given only through pip's configuration file.
    let pip_conf = dir.join("pip.conf");
    std::fs::write(
        &pip_conf,
        format!("[global]\nindex-url = http://127.0.0.1:{port}/simple\n"),
    )
    .unwrap();
    let fetch = |digest: &str, out: &Path| {
        Command::new("python3")
            .arg(repo_root().join("scripts/fetch-sdist.py"))
            .args(["Some.Project", "1.5.1", digest])
            .arg(out)
            .env("PIP_CONFIG_FILE", &pip_conf)
            .env_remove("PIP_INDEX_URL")
            .output()
            .unwrap()
    };
    let digest = sha256(&wanted);
    let out = dir.join("got.tar.gz");
    let fetched = fetch(&digest, &out);
    let wrong = dir.join("wrong.tar.gz");
    let refused = fetch(&"0".repeat(64), &wrong);
    server.kill().unwrap();
    let _ = server.wait();

    assert!(
        fetched.status.success(),
        "fetch-sdist failed: {}",
        text(&fetched.stderr)
    );
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&wanted).unwrap()
    );
    assert!(
        text(&fetched.stderr).contains(&format!(
            "127.0.0.1:{port}/files/ab/some_project-1.5.1.tar.gz"
        )),
        "{}",
        text(&fetched.stderr)
    );
    assert!(!refused.status.success(), "a wrong digest was accepted");
    assert!(
        text(&refused.stderr).contains("expected sha256"),
        "{}",
        text(&refused.stderr)
    );
    assert!(
        !wrong.exists() && !dir.join("wrong.tar.gz.partial").exists(),
        "a refused download left a file"
    );
}
