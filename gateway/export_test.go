package gateway

// SharesUnderWay reports what the call limiter counts in the callers'
// shares (limit.go): the identities with calls under way and each role's
// calls. Tests check that it returns to zero.
func (s *Server) SharesUnderWay() (identities int, byRole map[string]int) {
	return s.limit.underWay()
}
