package meta

import (
	"context"
	"slices"
	"testing"
	"time"

	weftv1 "github.com/weft-fs/weft/proto/weft/v1"
)

// TestInFlightRecords checks files created with their data in flight: the
// record kept until the client confirms the data, a second confirm
// reported unknown, files named unwritten settled at once, and the
// records a session left when it ended settled against the data server:
// a file whose first chunk is not there at its length is cut to length 0
// (here and on the data server), one whose chunk is there keeps its
// length, and one changed since its create is left as it is.
func TestInFlightRecords(t *testing.T) {
	ctx := context.Background()
	data := startChunkServer(t)
	s := openService(t, nil, data)
	m := serveMeta(t, s)
	a := watch(t, m)
	d, err := m.Mkdir(ctx, &weftv1.MkdirRequest{Caller: a.caller, Parent: rootIno, Name: "d", Mode: 0o755})
	if err != nil {
		t.Fatal(err)
	}
	g, err := m.Delegate(ctx, &weftv1.DelegateRequest{Caller: a.caller, Dir: d.Attr.Ino})
	if err != nil || !g.Granted {
		t.Fatalf("delegate: %v %v", g, err)
	}
	const size = 5000
	now := time.Now().UnixNano()
	files := []struct {
		name    string
		holds   int  // bytes of the first chunk on the data server (0: none)
		changed bool // its mtime changed after the create
		settle  string
		want    uint64 // size after settling
	}{
		{name: "confirmed", settle: "confirm", want: size},
		{name: "unwritten, missing", settle: "unwritten", want: 0},
		{name: "unwritten, there", holds: size, settle: "unwritten", want: size},
		{name: "left, missing", settle: "session end", want: 0},
		{name: "left, short", holds: size - 1, settle: "session end", want: 0},
		{name: "left, there", holds: size + 100, settle: "session end", want: size},
		{name: "left, changed since", changed: true, settle: "session end", want: size},
	}
	var nfs []*weftv1.NewFile
	for i, f := range files {
		nfs = append(nfs, &weftv1.NewFile{Caller: a.caller, Parent: d.Attr.Ino, Name: f.name, Mode: 0o644,
			Ino: g.InoFirst + uint64(i), TimeNs: now, Layout: g.Layouts[0],
			Committed: true, Size: size, MtimeNs: now + 1, DataInFlight: true})
	}
	// An empty file needs no record.
	nfs = append(nfs, &weftv1.NewFile{Caller: a.caller, Parent: d.Attr.Ino, Name: "empty", Mode: 0o644,
		Ino: g.InoFirst + uint64(len(files)), TimeNs: now, Layout: g.Layouts[0], Committed: true, DataInFlight: true})
	cm, err := m.CreateMany(ctx, &weftv1.CreateManyRequest{Session: a.session, Files: nfs})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range cm.Results {
		if r.Errno != 0 {
			t.Fatalf("%s: %s", nfs[i].Name, r.Error)
		}
	}
	records := func() []uint64 {
		var inos []uint64
		err := s.view(ctx, func(x *tx) error {
			inos = nil
			for _, nf := range nfs {
				if _, ok, err := x.inFlightOf(nf.Ino); err != nil {
					return err
				} else if ok {
					inos = append(inos, nf.Ino)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return inos
	}
	if got := len(records()); got != len(files) {
		t.Fatalf("%d in-flight records after the create, want %d (none for the empty file)", got, len(files))
	}
	var confirm, unwritten []uint64
	for i, f := range files {
		ino := nfs[i].Ino
		if f.holds > 0 {
			data.holdFirstChunk(ino, f.holds)
		}
		if f.changed {
			if _, err := m.SetAttr(ctx, &weftv1.SetAttrRequest{Caller: a.caller, Ino: ino, Valid: setMtime, MtimeNs: now + 7}); err != nil {
				t.Fatal(err)
			}
		}
		switch f.settle {
		case "confirm":
			confirm = append(confirm, ino)
		case "unwritten":
			unwritten = append(unwritten, ino)
		}
	}
	resp, err := m.CreateMany(ctx, &weftv1.CreateManyRequest{Session: a.session, Confirmed: confirm, Unwritten: unwritten})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Unknown) != 0 {
		t.Errorf("confirm: unknown %v, want none", resp.Unknown)
	}
	if want := []uint64{nfs[1].Ino}; !slices.Equal(resp.Emptied, want) {
		t.Errorf("unwritten: emptied %v, want %v", resp.Emptied, want)
	}
	resp, err = m.CreateMany(ctx, &weftv1.CreateManyRequest{Session: a.session, Confirmed: confirm})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(resp.Unknown, confirm) {
		t.Errorf("second confirm: unknown %v, want %v", resp.Unknown, confirm)
	}
	// A live session's records stay.
	if err := s.resolveOrphanedInFlight(ctx); err != nil {
		t.Fatal(err)
	}
	if got := len(records()); got != 4 {
		t.Fatalf("%d records with the session alive, want the 4 left", got)
	}
	if _, err := m.CloseSession(ctx, &weftv1.CloseSessionRequest{Session: a.session}); err != nil {
		t.Fatal(err)
	}
	if err := s.resolveOrphanedInFlight(ctx); err != nil {
		t.Fatal(err)
	}
	if left := records(); len(left) != 0 {
		t.Errorf("records %v left after the session ended and they were settled", left)
	}
	for i, f := range files {
		var a *weftv1.Attr
		err := s.view(ctx, func(x *tx) error {
			var err error
			a, err = x.inode(nfs[i].Ino, "test")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if a.Size != f.want {
			t.Errorf("%s: size %d after settling, want %d", f.name, a.Size, f.want)
		}
		if f.want == 0 {
			if got, ok := data.truncatedTo(nfs[i].Ino); !ok || got != 0 {
				t.Errorf("%s: cut to length 0 here but not on the data server (truncated %v to %d)", f.name, ok, got)
			}
		}
	}
}
