package main

import (
	"testing"

	pb "github.com/nvmegate/nvmegate/proto/nvmegate/v1"
)

// grants list says why a grant ended where it can be read: superseded by a
// newer grant, or still on its target.
func TestGrantRowState(t *testing.T) {
	for _, tc := range []struct {
		g    *pb.Grant
		want string
	}{
		{&pb.Grant{State: pb.GrantState_GRANT_STATE_ACTIVE}, "active"},
		{&pb.Grant{State: pb.GrantState_GRANT_STATE_RELEASED, SupersededBy: "g-new"}, "released (superseded by g-new)"},
		{&pb.Grant{State: pb.GrantState_GRANT_STATE_REVOKED, RemovalPending: true}, "revoked (removal pending)"},
		{&pb.Grant{State: pb.GrantState_GRANT_STATE_RELEASED, SupersededBy: "g-new", RemovalPending: true}, "released (superseded by g-new) (removal pending)"},
	} {
		row := grantRow(tc.g)
		if got := row[6]; got != tc.want {
			t.Errorf("state column %q, want %q", got, tc.want)
		}
	}
}
