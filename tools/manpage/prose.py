"""Hand-written prose of the man pages that python -m tools.manpage generates.

The generator takes synopses, options, help texts and defaults from the CLI itself; this file
adds what the CLI cannot say: descriptions, examples, and the words for exit codes and config
fields. Examples are checked against the command tree when the pages are generated.
"""

from __future__ import annotations

from typing import Any

# Hand-written prose, keyed by top-level command ("" is the root page). Examples are
# (what it does, command line); the command line is checked against the tree.
PROSE: dict[str, dict[str, Any]] = {
    "": {
        "description": [
            "mooncake runs every role of the Mooncake KVCache-centric serving architecture "
            "(FAST'25) from one command: a batch transfer engine that moves bytes between the "
            "registered memory of processes over pluggable transports; a store that pools the "
            "DRAM and SSD of many nodes into one cache of KV blocks; prefill and decode workers "
            "that reuse every cached prefix block; a conductor that routes each request to the "
            "prefill/decode pair with the lowest estimated time-to-first-token behind an "
            "OpenAI-compatible API; doctor; and the benchmarks that measure each layer. A "
            "laptop runs everything on loopback; a cluster runs the same commands on many "
            "hosts.",
            "Global options go before the command name. Every command accepts --help. "
            "Settings come from, in increasing precedence: built-in defaults, the TOML file "
            "given with --config, MOONCAKE_* environment variables, and command-line flags.",
            "With --json every command prints JSON instead of tables: one object per result, "
            "or one object per line for progress events of long-running commands.",
        ],
        "examples": [
            ("Serve a 1 GiB segment; it prints its name HOST:PORT and how to reach it:",
             "mooncake transfer serve --buffer-size 1GiB"),
            ("From another shell, write a file into it and read the bytes back:",
             "mooncake transfer write --target 127.0.0.1:PORT file"),
            (None, "mooncake transfer read --target 127.0.0.1:PORT --length 4KiB -o copy"),
            ("Measure loopback bandwidth and latency in one command:",
             "mooncake bench transfer --mode local --transport tcp --block-size 1MiB"),
            ("List the transport and tier plugins and why any is unavailable:",
             "mooncake plugins"),
            ("Serve a demo model with 2 prefill and 1 decode workers behind one OpenAI API:",
             "mooncake conductor start --local 2,1 --model demo --port 8000"),
        ],
    },
    "transfer": {
        "description": [
            "A segment is the named set of buffers one transfer engine registers; peers read "
            "and write it at an offset. serve registers a zeroed buffer and serves it until "
            "Ctrl-C or SIGTERM; write and read move a file's bytes into or out of a peer "
            "segment.",
            "Peers find a segment's descriptor through the metadata service named by "
            "--metadata: p2p (the default: the segment name is HOST:PORT and the initiator asks "
            "the target directly), an HTTP server started with metadata-server (segments may "
            "then have any name), or etcd. The target checks every request against its "
            "registered regions and refuses anything out of bounds. With --secret (or "
            "MOONCAKE_SECRET) every connection must prove the shared secret first. Listeners "
            "bind to 127.0.0.1 unless --host says otherwise.",
            "The transport is picked per peer: nixl (NIXL over UCX, the nixl extra) when UCX "
            "sees an RDMA NIC or a GPU, shm (shared memory) for a peer on the same host, tcp "
            "otherwise; --transport forces one, and --log-level info says which each peer got "
            "and why.",
        ],
        "examples": [
            ("Serve a 1 GiB segment on loopback:",
             "mooncake transfer serve --buffer-size 1GiB"),
            ("Write a file at offset 0 of that segment, then read 4 KiB back to stdout:",
             "mooncake transfer write --target 127.0.0.1:PORT file"),
            (None, "mooncake transfer read --target 127.0.0.1:PORT --length 4KiB -o -"),
            ("Name segments through a metadata server:",
             "mooncake transfer metadata-server --port 8080"),
            (None, "mooncake transfer serve --metadata http://127.0.0.1:8080/metadata "
                   "--name foo"),
            (None, "mooncake transfer write --metadata http://127.0.0.1:8080/metadata "
                   "--target foo file"),
            ("Require a shared secret:",
             "MOONCAKE_SECRET=s3cret mooncake transfer serve --buffer-size 64MiB"),
        ],
    },
    "store": {
        "description": [
            "Mooncake Store pools the DRAM of many processes into one key/value cache of "
            "objects (KV blocks). master runs the metadata service: it tracks mounted segments, "
            "allocates replicas on distinct segments, grants leases on get and evicts by LRU "
            "above the high watermark. serve runs a node that contributes a DRAM segment of "
            "--segment-size through a transfer engine and stays up until Ctrl-C or SIGTERM; "
            "the master drops its replicas when it stops or falls silent past the client TTL.",
            "put, get, rm, ls and stat are short-lived clients that contribute no memory: "
            "they reach the master given by --master (HOST:PORT, default 127.0.0.1:50051) and "
            "move object bytes over the transfer engine. A get leases the object for the "
            "master's lease TTL, and rm of a leased object fails unless --force is given. "
            "ls and stat print tables, or JSON with --json.",
            "With --secret (or MOONCAKE_SECRET) every request to the master carries an "
            "HMAC-SHA256 of that secret, and the node's transfer engine requires it too. "
            "Store errors (no such key, no space, master unreachable, wrong secret) exit "
            "with status 7.",
        ],
        "examples": [
            ("Run a master and a node contributing 1 GiB of DRAM:",
             "mooncake store master --port 50051"),
            (None, "mooncake store serve --master 127.0.0.1:50051 --segment-size 1GiB"),
            ("Store a file with two replicas, list keys, read it back:",
             "mooncake store put --replicas 2 prefix/key file"),
            (None, "mooncake store ls prefix/"),
            (None, "mooncake store get prefix/key -o copy"),
            ("Usage per tier as JSON, then remove the object:",
             "mooncake --json store stat"),
            (None, "mooncake store rm prefix/key"),
        ],
    },
    "bench": {
        "description": [
            "Benchmarks measure each layer against its peer or physical limit and report "
            "the results side by side with ratios, as a table or with --json.",
        ],
        "examples": [
            ("Loopback over tcp with 1 MiB blocks, target in a child process:",
             "mooncake bench transfer --mode local --transport tcp --block-size 1MiB"),
            ("Against a target served elsewhere:",
             "mooncake bench transfer --mode initiator --target 127.0.0.1:PORT"),
            ("The store against upstream's master and client, same workload, same run:",
             "mooncake bench store --compare-upstream"),
            ("Measure this machine for the conductor's cost model:",
             "mooncake bench profile --model demo-25m --threads 1 -o profile.json"),
            ("The FAST'25 trace (shipped with mooncake-cli) through every scheduling policy, "
             "simulated:", "mooncake bench trace --simulate --preset paper"),
            ("The same trace, live, through 2 prefill and 1 decode workers per policy:",
             "mooncake bench trace --trace conversation --local 2,1 --limit 200"),
            ("Another trace file, gzipped or not:",
             "mooncake bench trace --simulate --trace my_trace.jsonl.gz"),
        ],
    },
    "conductor": {
        "description": [
            "start serves the OpenAI API (/v1/completions and /v1/chat/completions, streaming "
            "or not, /v1/models), /health, Prometheus /metrics and GET /v1/instances, and "
            "routes each request: it tokenizes the prompt, computes the chained KV block keys, "
            "and lets the scheduling policy pick the prefill instance with the lowest "
            "estimated TTFT (queue time, prefill time of the uncached part, time to fetch a "
            "longer prefix held elsewhere) and a decode instance with KV room. A request the "
            "cluster has no room for now waits in a FIFO queue (at most --max-queue; 503 with "
            "Retry-After beyond; a client that disconnects leaves it); with --ttft-slo it "
            "gets 429 only when its predicted TTFT, the queue wait included, breaks the SLO "
            "(Retry-After: the predicted wait), and with --tbt-slo when the predicted TBT "
            "does. Decode workers allocate KV as sequences grow and preempt the most recently "
            "admitted ones when full, parking their KV in the store. A prefill instance that "
            "cannot be reached is marked dead and the request placed again.",
            "Workers come from --prefill/--decode (polled), register themselves over HTTP "
            "(mooncake prefill --conductor URL), or through etcd (--registry). With --local "
            "P,D it also starts, in this process, a store master, P prefill and D decode "
            "workers of --model: a whole cluster from one command. --explain FILE logs every "
            "decision with its per-candidate estimates.",
            "Every endpoint but the OpenAI API, /health and /metrics takes only requests "
            "signed with the cluster secret (--secret-file or MOONCAKE_SECRET, the same on "
            "every role; --local makes a fresh one), and the conductor signs its requests to "
            "the workers with it; beyond loopback it refuses to start without one. A worker's "
            "name stays its first registrant's. --api-key guards the OpenAI API "
            "(Authorization: Bearer KEY) and GET /v1/instances; --audit-log FILE appends a "
            "JSON line per registration, completion and refused access.",
        ],
        "examples": [
            ("A whole cluster on a laptop, with the demo model:",
             "mooncake conductor start --local 2,1 --model demo --port 8000"),
            ("In front of workers that register in etcd, with SLOs:",
             "mooncake conductor start --host 0.0.0.0 --model demo --registry "
             "etcd://10.0.0.5:2379 --secret-file /etc/mooncake/secret --api-key KEY "
             "--ttft-slo 2 --tbt-slo 0.1"),
        ],
    },
    "prefill": {
        "description": [
            "A prefill worker takes POST /v1/prefill requests one at a time in arrival order: "
            "it looks up the longest run of the prompt's leading KV blocks already in the "
            "store, loads them straight into its paged KV cache, computes the rest chunk by "
            "chunk, puts each new full block into the store, and writes the KV into the "
            "chosen decode worker's cache through the transfer engine while it computes. It "
            "answers with the first token and a timing breakdown (queue, load, compute, "
            "store, transfer). A request waiting behind others, or one the conductor names "
            "in POST /v1/prefetch while it waits in the conductor's queue, has its stored "
            "prefix pulled into this worker's own segment meanwhile (cancelled by POST "
            "/v1/prefetch/cancel), so its prefill reads it locally. It serves /health, "
            "/metrics and /v1/load, registers with a conductor when given --conductor, and on "
            "Ctrl-C finishes what is in flight.",
        ],
        "examples": [
            ("A prefill worker of the demo model, using a store master:",
             "mooncake prefill --model demo --store 127.0.0.1:50051 --listen 127.0.0.1:9100"),
        ],
    },
    "decode": {
        "description": [
            "A decode worker reserves KV blocks for requests (POST /v1/kv/reserve), admits "
            "them only while every running request keeps room to grow, and runs continuous "
            "batching: requests join and leave between decode steps and their blocks are "
            "freed as they leave. POST /v1/generate streams the tokens of a request as "
            "server-sent events.",
        ],
        "examples": [
            ("A decode worker registering with a conductor:",
             "mooncake decode --model demo --store 127.0.0.1:50051 --conductor "
             "http://127.0.0.1:8000"),
        ],
    },
    "models": {
        "description": [
            "Named models are real checkpoints (GGUF files) fetched into the cache on first "
            "use; the demos are random models built in. Every command that takes --model takes "
            "a named model, a demo, a .gguf file or a Hugging Face folder.",
            "models export writes a named model or a .gguf file as a Hugging Face folder "
            "(config.json, model.safetensors, the tokenizer with its chat template, "
            "generation_config.json) for transformers and vLLM: its weights are exactly what "
            "this engine dequantizes. DIR appears only when complete, so a failed or "
            "interrupted export leaves it as it was; --force replaces only a folder holding "
            "a config.json.",
        ],
        "examples": [
            ("SmolLM2-135M as a bfloat16 Hugging Face folder (then: vllm serve ./smollm2):",
             "mooncake models export smollm2-135m --hf ./smollm2"),
            ("As float32, replacing an earlier export, with the result as JSON:",
             "mooncake --json models export smollm2-135m --hf ./smollm2 --dtype float32 "
             "--force"),
        ],
    },
    "plugins": {
        "description": [
            "Transports (entry-point group mooncake.transports) and memory tiers "
            "(mooncake.tiers) are plugins; the built-ins register through the same entry "
            "points as third-party packages, but the transfer engine needs the tcp transport "
            "(it owns the engine's listener): a MOONCAKE_PLUGINS without tcp stops every role "
            "that starts an engine. A plugin that fails to import is listed with its "
            "package and error, and every other plugin keeps working.",
            "MOONCAKE_PLUGINS=tcp,shm restricts which plugins load, in the groups it names a "
            "plugin of; the others are listed as disabled. Each available transport also says "
            "when auto picks it (its priority and why).",
        ],
        "examples": [
            ("Everything, then only transports, as JSON:", "mooncake plugins"),
            (None, "mooncake --json plugins --group mooncake.transports"),
            ("Load only the tcp transport:", "MOONCAKE_PLUGINS=tcp mooncake plugins"),
        ],
    },
    "doctor": {
        "description": [
            "doctor runs eight groups of checks and prints one row per check: its status (ok, "
            "warn, fail or skipped), the evidence it rests on, and the fix. install: Python, "
            "the compiled streamed copy, torch, every plugin, pyverbs (only doctor reads "
            "devices through it). environment: proxy "
            "variables that would capture cluster traffic unless no_proxy covers the hosts, "
            "the hostname resolving to a "
            "non-loopback address, the engine's port free, the kernel's cross-memory copies "
            "between same-host processes (probed on a child). metadata: etcd reachable, "
            "healthy, "
            "its version and advertised client URLs, a put/get/delete probe under a scratch "
            "key, stale segment descriptors; an HTTP metadata server probed the same way; a "
            "URL that points at the wrong kind of server is named as such. master: reachable, "
            "leader, segments mounted, capacity used, clock skew, the master's root_fs_dir "
            "there and writable on this host. rdma, per device and port: state, link layer, "
            "active MTU (against --peer-mtu), the GID table and the GID index to use with the "
            "reason (RDMA runs through nixl: the fixes name UCX's UCX_IB_GID_INDEX and "
            "UCX_IB_PATH_MTU), memlock against the planned registration, max_mr_size, "
            "/dev/infiniband access, GPU peer memory. nixl: the package, UCX's version, the "
            "transports and "
            "devices UCX itself reports (verbs, cuda_ipc, gdr_copy, cma, tcp), cma between "
            "processes, RDMA devices UCX cannot use, CUDA, and whether GPUDirect RDMA can work "
            "(against a captured --sysfs-root only the package and UCX are checked). memory: "
            "hugepages free against the segment, NUMA layout, "
            "free RAM. network: the ephemeral port range, TIME_WAIT sockets, a live loopback "
            "transfer through the transfer engine and, with --peer, a probe and a one-second "
            "bandwidth test.",
            "The exit status is 0 when no check fails and 1 when one does (warnings do not "
            "count); --json prints {ok, counts, checks} for scripts. --sysfs-root reads sys/, "
            "proc/ and dev/ under another directory, such as a tree captured from another "
            "host.",
        ],
        "examples": [
            ("Check this host, an etcd and a master:",
             "mooncake doctor --metadata etcd://10.0.0.5:2379 --master 10.0.0.5:50051"),
            ("Only the RDMA checks of one NIC, against a peer whose active MTU is 4096:",
             "mooncake doctor --group rdma --device mlx5_0 --peer-mtu 4096"),
            ("Measure the path to a served segment, for a script:",
             "mooncake --json doctor --group network --peer 10.0.0.6:15000"),
        ],
    },
}

EXIT_PROSE = {
    "ConfigError": "a user mistake: bad flag value, config file or environment variable "
                   "(command-line usage errors exit 2 as well)",
    "PluginError": "a plugin is unknown, disabled by MOONCAKE_PLUGINS, broken or unavailable",
    "MetadataError": "the metadata service failed: a segment descriptor could not be published "
                     "or looked up (for example the metadata server is unreachable)",
    "TransferError": "a transfer failed: target segment not found or unreachable, secret "
                     "refused, out of bounds, peer died, timeout",
    "StoreError": "a store operation failed: no such key, key exists or is leased, no space, "
                  "the master is unreachable or refused the secret",
    "MooncakeError": "any other Mooncake error",
    "OSError": "an operating-system error (file, socket, shared memory)",
}
METAVARS = {"buffer_size": "SIZE", "length": "SIZE", "block_size": "SIZE", "metadata": "URL",
            "target": "SEGMENT", "name": "SEGMENT", "host": "ADDR", "advertise": "ADDR",
            "port": "PORT", "secret": "SECRET", "timeout": "SECONDS", "duration": "SECONDS",
            "output": "FILE", "file": "FILE", "group": "GROUP", "path": "PATH",
            "offset": "BYTES", "connections": "N", "threads": "N", "batch_size": "N",
            "sweep": "SIZES", "master": "HOST:PORT", "segment_size": "SIZE", "key": "KEY",
            "prefix": "PREFIX", "replicas": "N", "lease_ttl": "SECONDS",
            "put_timeout": "SECONDS", "client_ttl": "SECONDS", "high_watermark": "RATIO",
            "eviction_ratio": "RATIO"}
# Config fields whose source comment does not read well on its own (others use the comment).
FIELD_PROSE = {
    "port": "listen port; 0 picks a free port",
    "metadata": "where segment descriptors live: p2p, http://HOST:PORT/metadata or "
                "etcd://HOST:PORT[,HOST:PORT]",
    "transport": "auto picks the best reachable transport per peer; or tcp, shm, nixl, another "
                 "plugin",
    "secret": "shared secret every connection must prove (HMAC challenge); empty for none",
    "connections": "connections per peer",
    "workers": "threads that execute transfer requests",
    "metadata_ttl": "seconds a segment descriptor lives after its engine stops renewing it",
}
