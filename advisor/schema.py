"""The knowledge-base schema, defined once as append-only migrations, and opening a KB for reading.

Writers open a KB through `advisor.store.open_kb`, which applies these migrations; the answer side reads
through `connect_readonly` (stdlib sqlite3 only: `import sqlite_utils` pulls pandas, which would cost
the answer side half a second). The checks that refuse a file which is not a usable KB serve both.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from functools import cache
from pathlib import Path

MIGRATION_SET = "advisor"
MIGRATIONS_TABLE = "_sqlite_migrations"  # sqlite-utils' own bookkeeping table
BUSY_TIMEOUT_MS = 30_000
# `untrained`: the run ended without its held-out loss going below where it started (the fair protocol)
STATUSES = ("ok", "oom", "diverged", "untrained", "failed", "running", "crashed")
LEGACY_STATUSES = ("ok", "oom", "diverged", "failed", "running", "crashed")  # the CHECK of 0001-0007
PROTOCOLS = ("fair", "paper")  # measure's protocols (measure/protocol.py); runs that do not say: paper

# Append-only: never edit a migration that has shipped; add a new one.
MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_runs_metrics_epochs",
        f"""
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY,
            cell_key TEXT NOT NULL,            -- hash of the run's full configuration, seed excluded
            source TEXT NOT NULL,              -- 'paper:2608.08961', 'measured', 'import:<name>'
            model TEXT NOT NULL,               -- 'vit', 'modernbert', ..., a Hugging Face id or a path
            family TEXT NOT NULL,              -- 'vision', 'encoder', 'decoder', 'vlm' (rules/families.toml)
            optimizer TEXT NOT NULL,
            strategy TEXT NOT NULL,
            preset TEXT NOT NULL,              -- 'tiny', 'small', 'paper', 'custom'
            seed INTEGER,                      -- NULL where the source does not say
            hardware TEXT NOT NULL,            -- 'NVIDIA A100 40GB', 'CPU: AMD EPYC (2 cores)'
            device TEXT,                       -- 'cuda', 'cpu'
            host_memory_gb REAL,               -- RAM of the machine, GB
            accelerator_memory_gb REAL,        -- memory of the accelerator, GB; NULL on CPU
            software TEXT NOT NULL DEFAULT '{{}}', -- JSON: versions of python, torch, transformers, ...
            config TEXT NOT NULL DEFAULT '{{}}',   -- JSON: hyperparameters and everything the cell_key hashes
            pretrained INTEGER,                -- 1 pretrained weights, 0 random init, NULL unknown
            n_params INTEGER,
            status TEXT NOT NULL CHECK (status IN ({", ".join(repr(s) for s in LEGACY_STATUSES)})),
            error TEXT,                        -- why a run is not ok, as the user should read it
            started_at TEXT,                   -- ISO 8601 UTC
            finished_at TEXT
        );
        CREATE INDEX runs_group ON runs (family, source, hardware, preset, model, optimizer, strategy, status);
        CREATE INDEX runs_cell ON runs (cell_key, seed);
        CREATE TABLE metrics (                 -- run-level figures: one row per stated or summarised measure
            run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            name TEXT NOT NULL,                -- 'loss', 'epoch_time', 'host_ram', ... (rules/metrics.toml)
            value REAL NOT NULL,
            unit TEXT NOT NULL,
            certainty TEXT NOT NULL DEFAULT 'measured', -- 'measured', 'stated', 'inferred'
            note TEXT,                         -- where the figure comes from (e.g. the paper's section)
            PRIMARY KEY (run_id, name)
        ) WITHOUT ROWID;                       -- one b-tree lookup per figure: answers aggregate 100,000s
        CREATE TABLE epochs (                  -- per-epoch measurements of measured runs; NULL = not measurable
            run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
            epoch INTEGER NOT NULL,
            steps INTEGER NOT NULL,
            loss REAL,                         -- mean unscaled per-token (per-sample) loss of the epoch's steps
            wall_s REAL,                       -- seconds, warm-up excluded
            warmup_s REAL,                     -- seconds spent in warm-up steps (first epoch only)
            peak_rss_gb REAL,                  -- peak host RSS of the process and its children, GB
            peak_gpu_allocated_gb REAL,
            peak_gpu_reserved_gb REAL,
            gpu_util REAL,                     -- mean %, NVML
            cpu_util REAL,                     -- mean % of one core, psutil
            energy_j REAL,                     -- NVML energy counter difference
            PRIMARY KEY (run_id, epoch)
        );
        """,
    ),
    (
        "0002_run_owner",
        """
        ALTER TABLE runs ADD COLUMN owner TEXT;  -- 'host:pid' of the process running it, to find crashed runs
        """,
    ),
    (
        "0003_validations",
        """
        CREATE TABLE validations (             -- `advisor validate`: equivalence checks on a machine
            id INTEGER PRIMARY KEY,
            hardware TEXT NOT NULL,
            device TEXT,
            model TEXT,                        -- NULL for checks without a model (cgd, monitor)
            preset TEXT,
            name TEXT NOT NULL,                -- 'checkpointing_dropout_off', 'accumulation_gradient', ...
            passed INTEGER NOT NULL,           -- 1 passed, 0 failed
            value REAL,                        -- what was measured (e.g. max relative gradient error)
            tolerance REAL,                    -- the bound it must stay within
            detail TEXT NOT NULL,
            software TEXT NOT NULL DEFAULT '{}',
            created_at TEXT NOT NULL
        );
        CREATE INDEX validations_hardware ON validations (hardware, created_at);
        """,
    ),
    (
        "0004_run_protocol",
        """
        -- the settings a measured run changed from its preset's defaults ('lr=0.01, epochs=8'), or
        -- 'preset defaults'; NULL where the source does not say. Answers flag groups that mix protocols.
        ALTER TABLE runs ADD COLUMN protocol TEXT;
        """,
    ),
    (
        "0005_epoch_device_memory",
        """
        -- NVML's memory used on the device (every process, the CUDA context included), peak of the epoch, GB
        ALTER TABLE epochs ADD COLUMN gpu_device_mem_gb REAL;
        """,
    ),
    (
        "0006_predictions",
        """
        CREATE TABLE predictions (             -- `advisor fit`: traced training steps, never mixed with runs
            key TEXT PRIMARY KEY,              -- hash of all the prediction depends on (advisor/fit.py)
            model TEXT NOT NULL,               -- as asked: a reference name, a folder, a Hugging Face id
            config_hash TEXT NOT NULL,         -- sha256 of the model's config
            model_type TEXT,
            family TEXT,                       -- NULL: no family of rules/families.toml lists the model_type
            optimizer TEXT NOT NULL,
            strategy TEXT NOT NULL,
            dtype TEXT NOT NULL,               -- fp32, bf16-mixed, fp16-mixed, bf16
            seq_len INTEGER,                   -- text tokens per sample; NULL for images alone
            image_size INTEGER,
            device TEXT NOT NULL,              -- cuda, cpu: which optimizer implementations were traced
            software TEXT NOT NULL,            -- JSON: torch, transformers, the engine's version
            payload TEXT NOT NULL,             -- JSON: per phase, the lines of its peak in the batch; FLOPs
            created_at TEXT NOT NULL
        );
        CREATE INDEX predictions_model ON predictions (config_hash, dtype, seq_len, image_size);
        """,
    ),
    (
        "0007_run_identity_and_lease",
        """
        -- a run's identity across KBs (imports, merges): a hash of its provenance, given once and carried
        ALTER TABLE runs ADD COLUMN uid TEXT;
        -- until when a running run's owner holds it (ISO 8601 UTC); its heartbeat renews it. Past it, the
        -- run is crashed, whichever host ran it
        ALTER TABLE runs ADD COLUMN lease_until TEXT;
        -- Python: every existing run gets its uid (advisor/store.py: _backfill_uids)
        CREATE UNIQUE INDEX runs_uid ON runs (uid);
        """,
    ),
    (
        "0008_protocols_and_summaries",
        f"""
        -- runs rebuilt (SQLite cannot change a CHECK in place): status `untrained`; `protocol`, the column
        -- that held a run's changed settings, renamed `settings`; `protocol` now names how it was measured
        -- ('fair', 'paper'); `grp`, the evidence group it belongs to. Every existing run was measured as
        -- the paper measured (fixed epochs, training loss): protocol 'paper'.
        CREATE TABLE runs_new (
            id INTEGER PRIMARY KEY,
            cell_key TEXT NOT NULL,
            source TEXT NOT NULL,
            model TEXT NOT NULL,
            family TEXT NOT NULL,
            optimizer TEXT NOT NULL,
            strategy TEXT NOT NULL,
            preset TEXT NOT NULL,
            seed INTEGER,
            hardware TEXT NOT NULL,
            device TEXT,
            host_memory_gb REAL,
            accelerator_memory_gb REAL,
            software TEXT NOT NULL DEFAULT '{{}}',
            config TEXT NOT NULL DEFAULT '{{}}',
            pretrained INTEGER,
            n_params INTEGER,
            status TEXT NOT NULL CHECK (status IN ({", ".join(repr(s) for s in STATUSES)})),
            error TEXT,
            started_at TEXT,
            finished_at TEXT,
            owner TEXT,
            settings TEXT,                     -- what the run changed from its protocol's defaults ('lr=0.01')
            uid TEXT,
            lease_until TEXT,
            protocol TEXT NOT NULL DEFAULT 'paper' CHECK (protocol IN ({", ".join(repr(p) for p in PROTOCOLS)})),
            grp INTEGER REFERENCES groups (id)  -- set by advisor/store.py on every write, never by a file
        );
        INSERT INTO runs_new (id, cell_key, source, model, family, optimizer, strategy, preset, seed, hardware,
            device, host_memory_gb, accelerator_memory_gb, software, config, pretrained, n_params, status, error,
            started_at, finished_at, owner, settings, uid, lease_until, protocol)
        SELECT id, cell_key, source, model, family, optimizer, strategy, preset, seed, hardware, device,
            host_memory_gb, accelerator_memory_gb, software, config, pretrained, n_params, status, error,
            started_at, finished_at, owner, protocol, uid, lease_until, 'paper' FROM runs;
        DROP TABLE runs;
        ALTER TABLE runs_new RENAME TO runs;
        CREATE UNIQUE INDEX runs_uid ON runs (uid);
        CREATE INDEX runs_cell ON runs (cell_key, seed);
        CREATE INDEX runs_family ON runs (family, source);
        CREATE INDEX runs_grp_seed ON runs (grp, optimizer, strategy, seed, status);
        -- the runs that did not end ok, few among many: which seeds of a configuration failed, and why
        CREATE INDEX runs_not_ok ON runs (grp, optimizer, strategy) WHERE status != 'ok';

        -- Summaries, maintained inside every write transaction (advisor/store.py): answers read these, never
        -- aggregate every figure per question. A KB of 1,000,000 runs answers in well under a second.
        CREATE TABLE groups (                  -- evidence groups: runs that may be ranked against each other
            id INTEGER PRIMARY KEY,
            source TEXT NOT NULL,
            hardware TEXT NOT NULL,
            preset TEXT NOT NULL,
            model TEXT NOT NULL,
            family TEXT NOT NULL,
            protocol TEXT NOT NULL,
            n_params INTEGER,                  -- the largest a run of the group states
            UNIQUE (source, hardware, preset, model, family, protocol)
        );
        CREATE TABLE cell_status (             -- runs of a configuration by settings and status
            grp INTEGER NOT NULL,
            optimizer TEXT NOT NULL,
            strategy TEXT NOT NULL,
            settings TEXT NOT NULL,            -- '' where the run does not say
            status TEXT NOT NULL,
            n INTEGER NOT NULL,
            PRIMARY KEY (grp, optimizer, strategy, settings, status)
        ) WITHOUT ROWID;
        CREATE TABLE cell_stats (              -- each measure over the ok runs of a configuration
            grp INTEGER NOT NULL,
            optimizer TEXT NOT NULL,
            strategy TEXT NOT NULL,
            measure TEXT NOT NULL,
            scale TEXT NOT NULL,               -- '' or the runs column the value is multiplied by
            n INTEGER NOT NULL,
            total REAL NOT NULL,
            total_sq REAL NOT NULL,
            first_value REAL NOT NULL,         -- a stored figure and its unit, as its source states it
            first_unit TEXT NOT NULL,
            PRIMARY KEY (grp, optimizer, strategy, measure, scale)
        ) WITHOUT ROWID;
        CREATE TABLE seed_stats (              -- each measure of a configuration's ok runs of one seed
            grp INTEGER NOT NULL,
            measure TEXT NOT NULL,
            seed INTEGER NOT NULL,
            optimizer TEXT NOT NULL,
            strategy TEXT NOT NULL,
            n INTEGER NOT NULL,
            total REAL NOT NULL,
            PRIMARY KEY (grp, measure, seed, optimizer, strategy)
        ) WITHOUT ROWID;
        CREATE TABLE pair_stats (              -- paired by seed: d = mean of a's seed - mean of b's, a < b
            grp INTEGER NOT NULL,
            measure TEXT NOT NULL,
            a_optimizer TEXT NOT NULL,
            a_strategy TEXT NOT NULL,
            b_optimizer TEXT NOT NULL,
            b_strategy TEXT NOT NULL,
            n INTEGER NOT NULL,                -- seeds both configurations have
            sum_d REAL NOT NULL,
            sum_dd REAL NOT NULL,
            PRIMARY KEY (grp, measure, a_optimizer, a_strategy, b_optimizer, b_strategy)
        ) WITHOUT ROWID;
        -- per epoch, what the fair protocol and honest measures add (measure/summary.py). From 0008 on,
        -- cpu_util is the % of the cores the run used (capped at 100), from the process's CPU time
        ALTER TABLE epochs ADD COLUMN eval_loss REAL;        -- held-out loss after the epoch
        ALTER TABLE epochs ADD COLUMN eval_accuracy REAL;    -- held-out accuracy (top-1 of the targets)
        ALTER TABLE epochs ADD COLUMN micro_batches INTEGER;
        ALTER TABLE epochs ADD COLUMN samples INTEGER;
        ALTER TABLE epochs ADD COLUMN tokens INTEGER;        -- input tokens, padding excluded (text models)
        ALTER TABLE epochs ADD COLUMN model_flops REAL;      -- counted model FLOPs of the epoch's steps
        ALTER TABLE epochs ADD COLUMN step_time_cv REAL;     -- spread of its step times (std / mean)
        ALTER TABLE epochs ADD COLUMN others_cpu REAL;       -- cores other processes used meanwhile
        -- Python: every existing run gets its group and is summarised (advisor/summaries.py: rebuild)
        """,
    ),
    (
        "0009_run_data",
        """
        -- the data a run trained on (`advisor measure --data`): 'generated', a Hugging Face dataset at a
        -- commit ('pranavmr/MM-IMDb@ad5b994'), a local file or folder by name and content hash
        -- ('corpus.jsonl sha256:1a2b3c4d5e6f'). NULL where a file does not say: the summaries then fill it
        -- from the source (the paper trained on MM-IMDb at the commit it cites) or from what the run's
        -- config recorded, else '' (not stated). Runs on different data are never ranked together.
        ALTER TABLE runs ADD COLUMN data TEXT;
        -- evidence groups are keyed by their data too: the table rebuilt (SQLite cannot change a UNIQUE in
        -- place), then every group assigned again
        DROP TABLE groups;
        CREATE TABLE groups (
            id INTEGER PRIMARY KEY,
            source TEXT NOT NULL,
            hardware TEXT NOT NULL,
            preset TEXT NOT NULL,
            model TEXT NOT NULL,
            family TEXT NOT NULL,
            protocol TEXT NOT NULL,
            data TEXT NOT NULL DEFAULT '',
            n_params INTEGER,                  -- the largest a run of the group states
            UNIQUE (source, hardware, preset, model, family, protocol, data)
        );
        -- Python: every run gets its data and its group again, and is summarised (advisor/summaries.py)
        """,
    ),
]

# Identity fields of a run: what makes two rows the same run, in any KB.
IDENTITY = (
    "source",
    "model",
    "optimizer",
    "strategy",
    "preset",
    "hardware",
    "seed",
    "started_at",
    "owner",
    "config",
)


def run_uid(run: dict) -> str:
    """A run's identity: a hash of its provenance (never of its outcome, which changes)."""
    config = run.get("config") or {}
    if isinstance(config, str):
        config = json.loads(config)
    payload = {k: run.get(k) for k in IDENTITY if k != "config"} | {"config": config}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


KNOWN_MIGRATIONS = [name for name, _ in MIGRATIONS]


def cell_key(config: dict) -> str:
    """A stable hash of a run's configuration, seed excluded: runs with the same key repeat one cell."""
    payload = json.dumps({k: v for k, v in config.items() if k != "seed"}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


class KBError(Exception):
    """A knowledge base that cannot be used, with a sentence that says what to do."""


def statements(sql: str) -> list[str]:
    """Split a migration script into statements (executescript would commit the migration's transaction)."""
    out, pending = [], ""
    for line in sql.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            out.append(pending.strip())
            pending = ""
    if pending.strip():
        out.append(pending.strip())
    return out


def connect_readonly(path: str | Path) -> sqlite3.Connection:
    """Open a KB read-only with stdlib sqlite3 and check it is an advisor KB at this schema."""
    path = Path(path)
    check_readable(path)
    if path.stat().st_size == 0:
        raise KBError(
            f"{path} is empty, not a knowledge base. Pass --db with an advisor KB, or build one with `advisor kb build -o`."
        )
    conn = connect_ro(path)
    refuse_newer(conn, path)
    applied = applied_migrations(conn)
    if not applied:
        raise KBError(f"{path} is an SQLite file but not an advisor knowledge base (no schema recorded).")
    missing = [m for m in KNOWN_MIGRATIONS if m not in applied]
    if missing:
        raise KBError(
            f"{path} was written by an older advisor (schema lacks {', '.join(missing)}). "
            f"Run `advisor kb migrate --db {path}` to upgrade it."
        )
    conn.row_factory = sqlite3.Row
    return conn


def connect_ro(path: Path) -> sqlite3.Connection:
    """A read-only connection that has read the schema page (so a corrupt file fails here, with a sentence)."""
    uri = path.resolve().as_uri()
    try:
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError as e:
        if not any(s in str(e).lower() for s in ("unable to open", "readonly", "read-only")):
            raise KBError(f"cannot read {path}: {e}.") from e
    except sqlite3.DatabaseError as e:
        raise corrupt_error(path, e) from e
    # A WAL-mode file in a folder we cannot write (an installed package, a read-only mount): SQLite can
    # neither create the -shm file ("unable to open") nor write it ("attempt to write a readonly
    # database"). Read the file as immutable instead: writers leave a KB they let go checkpointed.
    conn = sqlite3.connect(f"{uri}?immutable=1", uri=True)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.DatabaseError as e:
        raise corrupt_error(path, e) from e
    return conn


def check_readable(path: Path) -> None:
    """Refuse, with a sentence, a path that is missing, a folder, unreadable or not an SQLite file."""
    if not path.exists():
        raise KBError(
            f"no knowledge base at {path}. Pass --db with an existing file, or build one with `advisor kb build`."
        )
    if path.is_dir():
        raise KBError(f"{path} is a folder, not a knowledge base file. Pass --db with an .sqlite file.")
    if not path.is_file():
        raise KBError(
            f"{path} is not a regular file (a device or a pipe), so not a knowledge base. Pass --db with an .sqlite file."
        )
    if not os.access(path, os.R_OK):
        raise KBError(f"cannot read {path}: permission denied.")
    with open(path, "rb") as f:
        header = f.read(16)
    if path.stat().st_size and header != b"SQLite format 3\x00":
        raise KBError(f"{path} is not an SQLite file, so not a knowledge base. Pass --db with an advisor KB.")


def corrupt_error(path: Path, e: Exception) -> KBError:
    return KBError(
        f"{path} is corrupt or truncated ({e}). Rebuild it with `advisor kb build`, or restore it from a copy."
    )


def applied_migrations(conn: sqlite3.Connection) -> list[str]:
    """The names of the advisor migrations a KB has, in order ([] for a file that is not an advisor KB)."""
    try:
        has_table = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", [MIGRATIONS_TABLE]
        ).fetchone()
        if not has_table:
            return []
        rows = conn.execute(
            f"SELECT name FROM {MIGRATIONS_TABLE} WHERE migration_set = ? ORDER BY rowid", [MIGRATION_SET]
        )
        return [r[0] for r in rows]
    except sqlite3.DatabaseError as e:
        raise KBError(f"cannot read the schema of the knowledge base: {e}.") from e


def refuse_newer(conn: sqlite3.Connection, path: Path) -> None:
    unknown = [m for m in applied_migrations(conn) if m not in KNOWN_MIGRATIONS]
    if unknown:
        raise KBError(
            f"{path} was written by a newer advisor (schema has {', '.join(unknown)}). "
            "Upgrade advisor (pip install -U advisor) to read it; nothing was changed."
        )


@cache
def columns(table: str) -> dict[str, tuple[str, bool]]:
    """A table's columns at the current schema: name -> (SQL type, required), from the migrations applied
    to an empty in-memory database. What an import may hold is derived from this, never listed twice."""
    conn = sqlite3.connect(":memory:")
    for _, sql in MIGRATIONS:
        for statement in statements(sql):
            conn.execute(statement)
    rows = conn.execute(f"PRAGMA table_info({table})").fetchall()
    conn.close()
    return {
        name: (kind.upper(), bool(notnull) and default is None and not pk)
        for _, name, kind, notnull, default, pk in rows
    }


def schema_sql(conn: sqlite3.Connection) -> list[str]:
    """The schema of a KB as sorted CREATE statements, for comparing two KBs."""
    rows = conn.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY type, name")
    return [" ".join(r[0].split()) for r in rows]
