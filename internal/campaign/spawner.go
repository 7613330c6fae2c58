package campaign

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// The spawner.
//
// The campaign's workloads hold descriptors of files on the mounts. A
// process forked from the campaign inherits them and closes them at
// execve (they are O_CLOEXEC), and every such close is a FUSE flush that
// the mount answers only when it can reach the meta service: a meta
// server restarted from the campaign while the mount waits for it hangs
// in execve, and the mount waits for ever. So the campaign starts every
// process through a spawner, a copy of its own binary started before any
// mount exists, that never opens a file on one.

// spawnerEnv, set to 1, makes the campaign's binary a spawner.
const spawnerEnv = "WEFT_CAMPAIGN_SPAWNER"

// MaybeSpawner runs the spawner and exits if this process was started as
// one; it returns at once otherwise. Call it first in the main function
// (or TestMain) of a binary that runs campaigns.
func MaybeSpawner() {
	if os.Getenv(spawnerEnv) != "1" {
		return
	}
	os.Exit(spawnerMain(os.Stdin, os.Stdout))
}

// spawnReq asks the spawner to start a process.
type spawnReq struct {
	ID   int      `json:"id"`
	Args []string `json:"args"` // Args[0] is the program
	Env  []string `json:"env"`
	// Log, for a daemon, is the file its output is appended to; without
	// it the spawner runs the program to its end (up to Timeout) and
	// answers with its output.
	Log     string        `json:"log"`
	Timeout time.Duration `json:"timeout"`
}

// spawnMsg is an answer of the spawner: to a request (ID), or the exit of
// a daemon (Exited).
type spawnMsg struct {
	ID     int    `json:"id"`
	Pid    int    `json:"pid"`
	Err    string `json:"err"`
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	Code   int    `json:"code"`
	Exited bool   `json:"exited"`
}

// Bounds of the protocol: a line (a command's output), a request's
// arguments and environment.
const (
	maxSpawnLine = 64 << 20
	maxSpawnArgs = 4096
	maxSpawnArg  = 64 << 10
)

// parseSpawnReq decodes and checks a request line.
func parseSpawnReq(line []byte) (spawnReq, error) {
	var req spawnReq
	if err := json.Unmarshal(line, &req); err != nil {
		return req, fmt.Errorf("bad request: %w", err)
	}
	if len(req.Args) == 0 || req.Args[0] == "" {
		return req, errors.New("bad request: no program")
	}
	if len(req.Args)+len(req.Env) > maxSpawnArgs {
		return req, fmt.Errorf("bad request: %d arguments and variables, at most %d", len(req.Args)+len(req.Env), maxSpawnArgs)
	}
	for _, a := range append(append([]string{req.Log}, req.Args...), req.Env...) {
		if len(a) > maxSpawnArg {
			return req, fmt.Errorf("bad request: an argument of %d bytes, at most %d", len(a), maxSpawnArg)
		}
	}
	if req.Timeout < 0 {
		return req, fmt.Errorf("bad request: timeout %v", req.Timeout)
	}
	return req, nil
}

// spawnerMain serves requests read from in until it ends.
func spawnerMain(in io.Reader, out io.Writer) int {
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	send := func(m spawnMsg) {
		mu.Lock()
		defer mu.Unlock()
		enc.Encode(m)
	}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), maxSpawnLine)
	for sc.Scan() {
		req, err := parseSpawnReq(sc.Bytes())
		if err != nil {
			send(spawnMsg{ID: req.ID, Err: err.Error()})
			continue
		}
		if req.Log == "" {
			go func() { send(runToEnd(req)) }()
			continue
		}
		cmd, err := startDaemon(req)
		if err != nil {
			send(spawnMsg{ID: req.ID, Err: err.Error()})
			continue
		}
		send(spawnMsg{ID: req.ID, Pid: cmd.Process.Pid})
		go func() {
			err := cmd.Wait()
			m := spawnMsg{Pid: cmd.Process.Pid, Exited: true}
			if err != nil {
				m.Err = err.Error()
			}
			send(m)
		}()
	}
	return 0
}

// startDaemon starts req's program in its own process group, its output
// appended to req.Log; it is killed if the spawner dies.
func startDaemon(req spawnReq) (*exec.Cmd, error) {
	logf, err := os.OpenFile(req.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own copy
	cmd := exec.Command(req.Args[0], req.Args[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = req.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return cmd, nil
}

// runToEnd runs req's program and returns its output and exit status.
func runToEnd(req spawnReq) spawnMsg {
	timeout := req.Timeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, req.Args[0], req.Args[1:]...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	cmd.Env = req.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err := cmd.Run()
	m := spawnMsg{ID: req.ID, Stdout: out.String(), Stderr: errOut.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && ctx.Err() == nil:
		m.Code = ee.ExitCode()
	case err != nil:
		m.Err = err.Error()
	}
	return m
}

// spawner is the campaign's side of a spawner process.
type spawner struct {
	cmd *exec.Cmd
	in  io.WriteCloser

	mu      sync.Mutex
	nextID  int
	answers map[int]chan answer
	exits   map[int]chan string // by pid: the exit, once
	dead    error
}

// answer is a spawner's answer to a request, with the channel of the
// exit of the daemon it started.
type answer struct {
	m    spawnMsg
	exit chan string
}

// startSpawner starts this binary again as a spawner.
func startSpawner() (*spawner, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	s := &spawner{answers: map[int]chan answer{}, exits: map[int]chan string{}}
	s.cmd = exec.Command(self)
	s.cmd.Env = append(os.Environ(), spawnerEnv+"=1")
	s.cmd.Stderr = os.Stderr
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if s.in, err = s.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the spawner: %w", err)
	}
	go s.read(out)
	return s, nil
}

// read dispatches the spawner's messages until it ends.
func (s *spawner) read(out io.Reader) {
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), maxSpawnLine)
	for sc.Scan() {
		var m spawnMsg
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		s.mu.Lock()
		if m.Exited {
			if ch := s.exits[m.Pid]; ch != nil {
				ch <- m.Err
				delete(s.exits, m.Pid)
			}
		} else if ch := s.answers[m.ID]; ch != nil {
			a := answer{m: m}
			if m.Pid > 0 {
				a.exit = make(chan string, 1)
				s.exits[m.Pid] = a.exit
			}
			ch <- a
			delete(s.answers, m.ID)
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	s.dead = errors.New("the spawner exited")
	for _, ch := range s.answers {
		ch <- answer{m: spawnMsg{Err: s.dead.Error()}}
	}
	s.answers = map[int]chan answer{}
	s.mu.Unlock()
}

// ask sends req and waits for its answer.
func (s *spawner) ask(req spawnReq) (spawnMsg, chan string) {
	s.mu.Lock()
	if s.dead != nil {
		s.mu.Unlock()
		return spawnMsg{Err: s.dead.Error()}, nil
	}
	s.nextID++
	req.ID = s.nextID
	ch := make(chan answer, 1)
	s.answers[req.ID] = ch
	b, _ := json.Marshal(req)
	_, err := s.in.Write(append(b, '\n'))
	s.mu.Unlock()
	if err != nil {
		return spawnMsg{Err: fmt.Sprintf("write to the spawner: %v", err)}, nil
	}
	a := <-ch
	return a.m, a.exit
}

// start starts a daemon whose output goes to logPath; exit receives how
// it ended.
func (s *spawner) start(args, env []string, logPath string) (pid int, exit chan string, err error) {
	m, exit := s.ask(spawnReq{Args: args, Env: env, Log: logPath})
	if m.Err != "" {
		return 0, nil, fmt.Errorf("start %s: %s", args[0], m.Err)
	}
	return m.Pid, exit, nil
}

// run runs a program to its end (up to timeout).
func (s *spawner) run(timeout time.Duration, args, env []string) (stdout, stderr string, code int, err error) {
	m, _ := s.ask(spawnReq{Args: args, Env: env, Timeout: timeout})
	if m.Err != "" {
		return m.Stdout, m.Stderr, m.Code, errors.New(m.Err)
	}
	return m.Stdout, m.Stderr, m.Code, nil
}

// close ends the spawner (its daemons get SIGKILL).
func (s *spawner) close() {
	s.in.Close()
	s.cmd.Process.Kill()
	s.cmd.Wait()
}
