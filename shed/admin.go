package shed

import (
	"slices"
	"strings"
)

// Info is a shedder as the admin API's GET /rate_limit/shed shows it.
type Info struct {
	Name string `json:"name"`
	// Utilization is u: the average of the last second's requests in
	// flight over capacity.
	Utilization float64 `json:"utilization"`
	// Amount is A.
	Amount   float64     `json:"amount"`
	InFlight int64       `json:"in_flight"`
	Capacity int         `json:"capacity"`
	DryRun   bool        `json:"dry_run,omitempty"`
	Classes  []ClassInfo `json:"classes"`
}

// ClassInfo is a class and the chance that a request of it is shed now.
type ClassInfo struct {
	Class      string  `json:"class"`
	DropChance float64 `json:"drop_chance"`
}

func (s *shedder) info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	a := s.load()
	out := Info{Name: s.name, Utilization: s.u, Amount: a, InFlight: s.inFlight.Load(), Capacity: s.capacity, DryRun: s.dryRun,
		Classes: make([]ClassInfo, len(s.classes))}
	for i, c := range s.classes {
		out.Classes[i] = ClassInfo{Class: c, DropChance: dropChance(a, len(s.classes), i)}
	}
	return out
}

// List returns every running shedder of this process, by name.
func List() []Info {
	out := []Info{}
	shedders.Range(func(_, v any) bool {
		out = append(out, v.(*shedder).info())
		return true
	})
	slices.SortFunc(out, func(a, b Info) int { return strings.Compare(a.Name, b.Name) })
	return out
}
