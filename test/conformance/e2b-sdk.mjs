// Drives the unmodified official `e2b` SDK against Cubicle's E2B door.
// The SDK finds the door through its own documented variables:
// E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY (a Cubicle API key).
// E2B_TEMPLATE names the Cubicle snapshot to boot. Prints SANDBOX <id> for
// the sandbox it leaves running (the Go test reads its audit record) and
// E2B PASSED at the end.
import { Sandbox, AuthenticationError, CommandExitError, NotFoundError, TimeoutError } from 'e2b'

const template = process.env.E2B_TEMPLATE
let step = ''
function check(cond, what) {
  if (!cond) throw new Error(`${step}: check failed: ${what}`)
}
async function rejects(p, cls, what) {
  try {
    await p
  } catch (e) {
    check(e instanceof cls, `${what}: got ${e?.constructor?.name}: ${e?.message}`)
    return e
  }
  check(false, `${what}: did not throw`)
}
const sleep = (ms) => new Promise((res) => setTimeout(res, ms))
const t0 = Date.now()
function at(name) {
  step = name
  console.log(`[${((Date.now() - t0) / 1000).toFixed(2)}s] ${name}`)
}

at('create')
const sbx = await Sandbox.create(template, { timeoutMs: 120_000, metadata: { suite: 'e2b' } })
console.log(`SANDBOX ${sbx.sandboxId}`)
check(await sbx.isRunning(), 'isRunning')

at('commands.run output and exit code')
const r = await sbx.commands.run('echo hello-e2b; echo oops >&2')
check(r.exitCode === 0 && r.stdout === 'hello-e2b\n' && r.stderr === 'oops\n', JSON.stringify(r))
const ex = await rejects(sbx.commands.run('echo partial; exit 3'), CommandExitError, 'non-zero exit')
check(ex.exitCode === 3 && ex.stdout === 'partial\n', `exit error ${ex.exitCode} ${ex.stdout}`)
const env = await sbx.commands.run('echo "$FOO"; pwd', { envs: { FOO: 'bar' }, cwd: '/tmp' })
check(env.stdout === 'bar\n/tmp\n', `envs and cwd: ${JSON.stringify(env.stdout)}`)
let streamed = ''
await sbx.commands.run('echo one; echo two', { onStdout: (d) => { streamed += d } })
check(streamed === 'one\ntwo\n', `onStdout: ${JSON.stringify(streamed)}`)

at('background command and wait')
const bg = await sbx.commands.run('sleep 0.5; echo done-bg', { background: true })
check(bg.pid > 0, 'pid')
const bgRes = await bg.wait()
check(bgRes.stdout === 'done-bg\n', `background: ${JSON.stringify(bgRes)}`)

at('stdin')
const cat = await sbx.commands.run('cat', { background: true, stdin: true })
await sbx.commands.sendStdin(cat.pid, 'piped-in\n')
await sbx.commands.closeStdin(cat.pid)
const catRes = await cat.wait()
check(catRes.stdout === 'piped-in\n', `stdin: ${JSON.stringify(catRes.stdout)}`)

at('list, connect and kill')
const sleeper = await sbx.commands.run('sleep 60', { background: true })
const procs = await sbx.commands.list()
check(procs.some((p) => p.pid === sleeper.pid), `list: ${JSON.stringify(procs)}`)
const joined = await sbx.commands.connect(sleeper.pid)
check(await sbx.commands.kill(sleeper.pid) === true, 'kill')
await rejects(sleeper.wait(), CommandExitError, 'killed command')
await rejects(joined.wait(), CommandExitError, 'killed command (connected)')
check(await sbx.commands.kill(sleeper.pid) === false, 'kill of a finished command')
await rejects(sbx.commands.run('sleep 10', { timeoutMs: 1000 }), TimeoutError, 'command timeout')

at('pty')
let term = ''
const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { term += new TextDecoder().decode(d) } })
await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 })
await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; exit\n'))
await pty.wait()
check(term.includes('30 100'), `pty output: ${JSON.stringify(term)}`)

at('files')
const info = await sbx.files.write('/tmp/e2b/a.txt', 'content-a')
check(info.path === '/tmp/e2b/a.txt' && info.name === 'a.txt', `write: ${JSON.stringify(info)}`)
check(await sbx.files.read('/tmp/e2b/a.txt') === 'content-a', 'read')
await sbx.files.write([{ path: '/tmp/e2b/b.txt', data: 'bb' }, { path: '/tmp/e2b/c.txt', data: 'ccc' }])
const entries = await sbx.files.list('/tmp/e2b')
const names = entries.map((e) => `${e.name}:${e.type}`).sort().join(',')
check(names === 'a.txt:file,b.txt:file,c.txt:file', `list: ${names}`)
check(entries.find((e) => e.name === 'c.txt').size === 3, 'size')
check(await sbx.files.exists('/tmp/e2b/a.txt') && !(await sbx.files.exists('/tmp/e2b/none')), 'exists')
check(await sbx.files.makeDir('/tmp/e2b/sub') === true && await sbx.files.makeDir('/tmp/e2b/sub') === false, 'makeDir')
const moved = await sbx.files.rename('/tmp/e2b/b.txt', '/tmp/e2b/sub/b.txt')
check(moved.path === '/tmp/e2b/sub/b.txt', `rename: ${JSON.stringify(moved)}`)
await sbx.files.remove('/tmp/e2b/c.txt')
check(!(await sbx.files.exists('/tmp/e2b/c.txt')), 'remove')
await rejects(sbx.files.read('/tmp/e2b/missing.txt'), NotFoundError, 'read of a missing file')
await rejects(sbx.files.list('/no/such/dir'), NotFoundError, 'list of a missing dir')

at('watchDir')
const seen = []
const watcher = await sbx.files.watchDir('/tmp/e2b', (ev) => seen.push(`${ev.type}:${ev.name}`))
await sbx.files.write('/tmp/e2b/watched.txt', 'w')
await sbx.files.remove('/tmp/e2b/a.txt')
for (let i = 0; i < 50 && !(seen.includes('create:watched.txt') && seen.includes('remove:a.txt')); i++) {
  await new Promise((res) => setTimeout(res, 100))
}
await watcher.stop()
check(seen.includes('create:watched.txt') && seen.includes('remove:a.txt'), `watch events: ${seen}`)

at('setTimeout, getInfo, list')
await sbx.setTimeout(180_000)
const got = await sbx.getInfo()
check(got.sandboxId === sbx.sandboxId && got.state === 'running' && got.metadata.suite === 'e2b', `getInfo: ${JSON.stringify(got)}`)
const listed = await Sandbox.list({ query: { metadata: { suite: 'e2b' } } }).nextItems()
check(listed.some((s) => s.sandboxId === sbx.sandboxId), `list: ${JSON.stringify(listed)}`)

at('pause and resume')
const other = await Sandbox.create(template, { timeoutMs: 120_000 })
await other.commands.run('echo kept > /tmp/state')
const daemonPid = (await other.commands.run('setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!')).stdout.trim()
await other.commands.run(`kill -0 ${daemonPid}`)
check(await other.pause() === true, 'pause')
check((await other.getInfo()).state === 'paused', 'paused state')
check(await other.pause() === false, 'pause of a paused sandbox')
await sleep(2000) // past the timeout's delete-after-stop: a paused sandbox is kept
check((await other.getInfo()).state === 'paused', 'still paused')
const resumed = await Sandbox.connect(other.sandboxId)
check((await resumed.commands.run('cat /tmp/state')).stdout === 'kept\n', 'state after resume')
await resumed.commands.run(`kill -0 ${daemonPid}`) // memory kept: the process survived

at('timeout kills')
const short = await Sandbox.create(template, { timeoutMs: 1000 })
let alive = true
for (let i = 0; i < 40 && alive; i++) {
  await sleep(250) // lists do not count as activity; getInfo would
  alive = (await Sandbox.list().nextItems()).some((s) => s.sandboxId === short.sandboxId)
}
check(!alive, 'a sandbox past its timeout is killed')

at('kill and errors')
check(await resumed.kill() === true, 'kill')
check(await Sandbox.kill(other.sandboxId) === false, 'kill of a killed sandbox')
await rejects(Sandbox.getInfo(other.sandboxId), NotFoundError, 'getInfo of a killed sandbox')
await rejects(Sandbox.connect(other.sandboxId), NotFoundError, 'connect to a killed sandbox')
await rejects(other.commands.run('true'), Error, 'command in a killed sandbox')
await rejects(Sandbox.create(template, { apiKey: 'not-a-key' }), AuthenticationError, 'bad key')

at('done')
console.log('E2B PASSED')
