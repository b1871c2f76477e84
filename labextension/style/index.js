import './base.css';
import './hang.css';
import './grid.css';
import './balance.css';
import './summary.css';
