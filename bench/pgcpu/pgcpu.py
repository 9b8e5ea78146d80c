#!/usr/bin/env python3
"""Postgres CPU and commits of one `workpump bench` run (BENCHMARKS.md).

usage: pgcpu.py DBNAME workpump bench --database-url URL-of-DBNAME ... --json

Runs the command and, every 50 ms, reads user+system CPU (/proc/PID/stat)
of every Postgres backend whose process title names DBNAME. It prints one
JSON line:

  drain_backend_cpu_s        those backends' CPU between the bench's
                             "enqueued" and "drained" lines (the drain)
  backend_cpu_s              the same over the whole run (migration, enqueue,
                             drain, schema drop)
  postmaster_children_cpu_s  the postmaster's reaped children's CPU over the
                             run (cutime+cstime): every database's backends
                             that exited, other clients' included
  commits_whole_run          xact_commit delta of DBNAME over the run
  bench                      the bench's own --json line

Give the bench a database of its own: the backend sampling and xact_commit
then count only the bench. Linux only; needs the Debian cluster's pid file
(/var/run/postgresql/15-main.pid) for the postmaster figure and psql on PATH.
"""
import json
import os
import subprocess
import sys
import threading
import time

db = sys.argv[1]
cmd = sys.argv[2:]
hz = os.sysconf('SC_CLK_TCK')
pm = int(open('/var/run/postgresql/15-main.pid').readline())


def stat_fields(pid):
    # Fields after the command name: index 11/12 are utime/stime (fields
    # 14/15 of proc(5)), 13/14 cutime/cstime (16/17).
    return open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()


def postmaster_children_cpu():
    f = stat_fields(pm)
    return (int(f[13]) + int(f[14])) / hz


def commits():
    out = subprocess.run(['psql', '-Atq', f'postgres://postgres@127.0.0.1:5432/{db}?sslmode=disable', '-c',
                          'select xact_commit from pg_stat_database where datname = current_database()'],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip())


seen = {}  # backend pid -> its latest CPU seconds; an exited backend keeps its last sample
lock = threading.Lock()


def sample():
    with lock:
        for p in os.listdir('/proc'):
            if not p.isdigit():
                continue
            try:
                title = open(f'/proc/{p}/cmdline', 'rb').read().decode(errors='replace')
                if not title.startswith('postgres:') or f' {db} ' not in title:
                    continue
                f = stat_fields(p)
                seen[p] = (int(f[11]) + int(f[12])) / hz
            except OSError:
                pass  # exited meanwhile


def total(base):
    with lock:
        return sum(v - base.get(k, 0) for k, v in seen.items())


c0 = commits()
time.sleep(0.2)
sample()
base = dict(seen)
p0 = postmaster_children_cpu()
proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
marks, lines = {}, []


def reader():
    for line in proc.stdout:
        lines.append(line)
        if line.startswith('enqueued') or line.startswith('drained'):
            sample()
            marks[line.split()[0]] = total(base)


t = threading.Thread(target=reader)
t.start()
while proc.poll() is None:
    sample()
    time.sleep(0.05)
t.join()
time.sleep(1.5)  # exited backends are reaped and their statistics flushed
p1 = postmaster_children_cpu()
c1 = commits()
js = [l for l in lines if l.startswith('{')]
print(json.dumps({
    'drain_backend_cpu_s': round(marks.get('drained', 0) - marks.get('enqueued', 0), 2),
    'backend_cpu_s': round(total(base), 2),
    'postmaster_children_cpu_s': round(p1 - p0, 2),
    'commits_whole_run': c1 - c0,
    'bench': json.loads(js[-1]) if js else None,
}))
sys.exit(proc.returncode)
