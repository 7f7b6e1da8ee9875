package interop

import (
	"strings"
	"testing"
)

// TestResultRow counts the result rows of perftest outputs the VM has
// printed, the 2-byte row of infinities of a loaded host among them.
func TestResultRow(t *testing.T) {
	out := ` #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 2       5          inf            inf          inf      	       inf         	-nan   		inf     		inf    
 4       5          293.29         3189.37      816.51   	       816.51      	523.00 		3189.37 		3189.37
 8388608 5          726794.49        918497.25      735816.39  	       735816.39     	9021.00		918497.25 		918497.25
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      5                46.94              12.07  		   0.000193
 local address: LID 0000 QPN 0x0002 PSN 0x19076a
`
	if n := len(resultRow.FindAllString(out, -1)); n != 4 {
		t.Fatalf("%d rows, want 4", n)
	}
}

// TestPerftestPlan checks RDMATAP_INTEROP_ONLY and _REPEAT.
func TestPerftestPlan(t *testing.T) {
	names := func() string {
		var s []string
		for _, c := range perftestPlan(t) {
			s = append(s, c.name+"="+c.test)
		}
		return strings.Join(s, " ")
	}
	if got := names(); got != "write_bw=write_bw read_bw=read_bw send_bw=send_bw write_lat=write_lat read_lat=read_lat send_lat=send_lat" {
		t.Errorf("default plan: %s", got)
	}
	t.Setenv("RDMATAP_INTEROP_ONLY", "send_lat, read_lat")
	t.Setenv("RDMATAP_INTEROP_REPEAT", "2")
	if got := names(); got != "read_lat=read_lat read_lat_2=read_lat send_lat=send_lat send_lat_2=send_lat" {
		t.Errorf("read_lat and send_lat twice: %s", got)
	}
}
